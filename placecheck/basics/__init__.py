"""placecheck's torch-free basics: errors, the values read at the edge (sizes, devices, sites), every
option of every command (one frozen object each) and the TOML configuration, quieting libraries, the
simulation's stated limits, and the one way torch is patched.
"""
