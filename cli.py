"""`python cli.py …` from a checkout: the same `gflbench` command line the installed script runs.

The wiring lives in gfl_bench/commands/app.py, inside the package, because the installed distribution claims only
the `gflbench` import name; this file is not installed.
"""

from gflbench.commands.app import app

if __name__ == "__main__":
    app()
