"""A command loads only what it needs: `gflbench --help` and the store readers (import, failed, export) do not
import torch, PyG or pandas.

Importing torch and PyG costs seconds and hundreds of MB (docs/architecture.md, "Import cost"), so the command
modules import the engine inside the commands that train or load graphs. Each check runs in a fresh interpreter,
because this test session has long imported torch itself.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gflbench.experiments.store import RunStore

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "torch_geometric", "pandas")  # pandas: 1.5 s, loaded only by the readers of whole tables

# Runs each command line of argv[1] (a JSON list of lists) in this interpreter, then prints its exit codes and
# which of HEAVY it has imported. `then` names a module imported last: the check's own control.
PROBE = f"""
import json, sys
commands, then = json.loads(sys.argv[1]), sys.argv[2]
from gflbench.commands.app import app
codes = []
for args in commands:
    try:
        app(args, prog_name="gflbench")
    except SystemExit as stop:
        codes.append(stop.code or 0)
if then:
    __import__(then)
print(json.dumps({{"codes": codes, "loaded": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""


def _probe(commands: list[list[str]], then: str = "") -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(commands), then], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


RECORDS = ROOT / "results" / "records" / "2026-12-03-paper-presets.jsonl.gz"  # committed runs: real records


@pytest.fixture
def exported(tmp_path: Path) -> Path:
    """Three committed run records, as `gflbench export` writes them."""
    with gzip.open(RECORDS, "rt") as handle:
        lines = [next(handle) for _ in range(3)]
    path = tmp_path / "three.jsonl"
    path.write_text("".join(lines))
    return path


def test_help_and_store_readers_do_not_import_torch(exported: Path, tmp_path: Path) -> None:
    store, out = tmp_path / "runs.sqlite", tmp_path / "again.jsonl"
    commands = [["--help"], ["run", "--help"], ["table", "--help"], ["import", str(exported), "--store", str(store)],
                ["failed", "--store", str(store)], ["export", str(out), "--store", str(store)]]  # fmt: skip
    result = _probe(commands)
    assert result["codes"] == [0] * len(commands)
    assert result["loaded"] == [], f"imported by --help or a store reader: {result['loaded']}"
    with RunStore(store) as runs:  # each command did its work: import checked and stored, export wrote back
        assert len(runs) == 3
    assert [json.loads(line)["run_key"] for line in out.read_text().splitlines()] == [
        json.loads(line)["run_key"] for line in exported.read_text().splitlines()
    ]


def test_the_probe_sees_torch_when_it_is_imported(tmp_path: Path) -> None:
    """The control: the same probe, with the engine imported after the commands, reports torch and PyG."""
    result = _probe([["failed", "--store", str(tmp_path / "runs.sqlite")]], then="gflbench.experiments.runner")
    assert result["codes"] == [0] and {"torch", "torch_geometric"} <= set(result["loaded"])
