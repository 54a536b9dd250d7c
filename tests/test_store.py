"""The run store never loses or duplicates a finished run, also when the process is killed."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from gfl_bench.store import RunStore

GRID = ["run", "--method", "fedavg", "--dataset", "tiny", "--clients", "5", "--seeds", "6", "--rounds", "40"]


def _record(key: str, test: float = 0.5) -> dict:
    return {
        "run_key": key, "config_key": "c", "method": "fedavg", "dataset": "tiny", "scheme": "metis",
        "clients": 5, "data_seed": 1234, "seed": 0, "metric": "accuracy", "best_round": 0, "val": 0.5,
        "test": test, "val_weighted": 0.5, "test_weighted": 0.5, "seconds_per_round": [0.1, 0.3],
        "finished_at": time.time(),
    }  # fmt: skip


def test_put_is_idempotent_unless_replaced(tmp_path):
    with RunStore(tmp_path / "runs.sqlite") as store:
        store.put(_record("a", 0.5))
        store.put(_record("a", 0.9))
        assert len(store) == 1 and store.record("a")["test"] == 0.5
        store.put(_record("a", 0.9), replace=True)
        assert len(store) == 1 and store.record("a")["test"] == 0.9
        assert store.frame()["seconds_per_round"].tolist() == [pytest.approx(0.2)]


def test_store_written_before_the_client_best_columns_gains_them(tmp_path):
    path = tmp_path / "old.sqlite"
    old = sqlite3.connect(path)
    old.executescript(
        "CREATE TABLE runs (run_key TEXT PRIMARY KEY, config_key TEXT NOT NULL, method TEXT NOT NULL,"
        " dataset TEXT NOT NULL, scheme TEXT NOT NULL, clients INTEGER NOT NULL, data_seed INTEGER NOT NULL,"
        " seed INTEGER NOT NULL, metric TEXT NOT NULL, status TEXT NOT NULL, best_round INTEGER, val REAL,"
        " test REAL, val_weighted REAL, test_weighted REAL, seconds_per_round REAL, finished_at REAL NOT NULL,"
        " record TEXT NOT NULL);"
        "INSERT INTO runs VALUES ('old', 'c', 'fedavg', 'tiny', 'metis', 5, 1234, 0, 'accuracy', 'ok', 0,"
        " 0.5, 0.4, 0.5, 0.4, 0.1, 0.0, '{}');"
    )
    old.commit()
    old.close()
    with RunStore(path) as store:
        store.put({**_record("new"), "val_client_best": 0.6, "test_client_best": 0.55})
        frame = store.frame().set_index("run_key")
    assert frame.loc["old", "test"] == 0.4 and pd.isna(frame.loc["old", "test_client_best"])
    assert frame.loc["new", "test_client_best"] == 0.55


# The child process, holding the grid once the store has `after` runs (0: never), so that a test's signal lands
# mid-grid whatever the machine's speed: the store's `put` is wrapped here, in the test, not in the executor.
CHILD = """
import sys, time
from gfl_bench.store import RunStore
after, put = int(sys.argv.pop(1)), RunStore.put

def put_then_hold(self, record, *args, **kwargs):
    put(self, record, *args, **kwargs)
    if after and len(self) >= after:
        time.sleep(3600)

RunStore.put = put_then_hold
from cli import app
sys.argv[0] = 'gflbench'
app()
"""


def _gflbench(args: list[str], store: Path, tmp_path: Path, pause_after: int | None = None) -> subprocess.Popen:
    env = {**os.environ, "GFLBENCH_DATA": str(tmp_path / "data")}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(pause_after or 0), *args, "--store", str(store), "--device", "cpu"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        cwd=Path(__file__).resolve().parent.parent, preexec_fn=_interruptible,
    )  # fmt: skip


def _interruptible() -> None:
    """In the child, before exec: SIGINT as a terminal delivers it. A test run started in the background
    by a shell without job control (`pytest &` in a script) ignores SIGINT, the child would inherit
    that, and Python installs no KeyboardInterrupt handler for an ignored SIGINT: Ctrl-C could not be tested."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for_runs(store: Path, count: int, proc: subprocess.Popen, limit: float = 120) -> None:
    deadline = time.time() + limit
    while time.time() < deadline:
        if store.exists():
            with RunStore(store) as s:
                if len(s) >= count:
                    return
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.05)
    raise AssertionError("no run finished in time")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_killed_grid_keeps_finished_runs_and_resumes(tmp_path, sig):
    store = tmp_path / "runs.sqlite"
    proc = _gflbench(GRID, store, tmp_path, pause_after=2)  # the grid holds after 2 runs: the signal lands mid-grid
    _wait_for_runs(store, 2, proc)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and "Traceback" not in out
    with RunStore(store) as s:
        kept = len(s)
        keys = set(s.frame()["run_key"])
    assert kept == 2 and len(keys) == kept

    resumed = _gflbench(GRID, store, tmp_path)
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out
    assert f"{kept} already stored, {6 - kept} to run" in out
    with RunStore(store) as s:
        assert len(s) == 6
        assert keys <= set(s.frame()["run_key"])  # the finished runs were kept, not recomputed
