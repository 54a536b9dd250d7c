"""A command loads only what it needs: `gflbench --help` and the store readers do not import torch, PyG or pandas.

Importing torch and PyG costs seconds and hundreds of MB (docs/architecture.md, "Import cost"), so cli.py
imports the engine inside the commands that train or load graphs. Each check runs in a fresh interpreter,
because this test session has long imported torch itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gfl_bench.store import RunStore

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "torch_geometric", "pandas")  # pandas: 1.5 s, loaded only by the readers of whole tables

# Runs each command line of argv[1] (a JSON list of lists) in this interpreter, then prints its exit codes and
# which of HEAVY it has imported. `then` names a module imported last: the check's own control.
PROBE = """
import json, sys
commands, then = json.loads(sys.argv[1]), sys.argv[2]
from cli import app
codes = []
for args in commands:
    try:
        app(args, prog_name="gflbench")
    except SystemExit as stop:
        codes.append(stop.code or 0)
if then:
    __import__(then)
print(json.dumps({"codes": codes, "loaded": [m for m in %r if m in sys.modules]}))
""" % (HEAVY,)


def _probe(commands: list[list[str]], then: str = "") -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(commands), then], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A store with one finished run and one failed one (the records only: nothing here trains)."""
    path = tmp_path / "runs.sqlite"
    base = {"config_key": "c", "method": "fedavg", "dataset": "tiny", "scheme": "metis", "clients": 5,
            "data_seed": 1234, "metric": "accuracy", "finished_at": time.time()}  # fmt: skip
    with RunStore(path) as runs:
        runs.put({**base, "run_key": "a", "seed": 0, "status": "ok", "best_round": 0, "val": 0.5, "test": 0.4,
                  "val_weighted": 0.5, "test_weighted": 0.4, "seconds_per_round": [0.1, 0.2]})  # fmt: skip
        runs.put({**base, "run_key": "b", "seed": 1, "status": "failed", "error": "boom"})
    return path


def test_help_and_store_readers_do_not_import_torch(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs.jsonl"
    commands = [["--help"], ["run", "--help"], ["table", "--help"], ["failed", "--store", str(store)],
                ["export", str(out), "--store", str(store)]]  # fmt: skip
    result = _probe(commands)
    assert result["codes"] == [0] * len(commands)
    assert result["loaded"] == [], f"imported by --help or a store reader: {result['loaded']}"
    assert len(out.read_text().splitlines()) == 2  # export did its work: both records written


def test_the_probe_sees_torch_when_it_is_imported(store: Path) -> None:
    """The control: the same probe, with the engine imported after the commands, reports torch and PyG."""
    result = _probe([["failed", "--store", str(store)]], then="gfl_bench.runner")
    assert result["codes"] == [0] and {"torch", "torch_geometric"} <= set(result["loaded"])
