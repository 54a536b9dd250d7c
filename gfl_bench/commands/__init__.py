"""The commands of `gflbench`, one module per group; cli.py wires them into one command line."""
