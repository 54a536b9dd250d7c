"""The commands of `gflbench`, one module per group; app.py wires them into one command line (the root cli.py
runs that same app from a checkout)."""
