"""The checks: the walk after .to(), the traced forward and its events, what an error means (classify),
host syncs and copies, where a tensor came from, and the user's lines.
"""
