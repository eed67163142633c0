"""The finding record, the rules that declare every code, findings grouped into problems, and their
reports: the report, its formats, where it is written and its exit code, baselines and shards.
Torch-free.
"""
