"""The run store never loses or duplicates a finished run, also when the process is killed."""

from __future__ import annotations

import gzip
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from gflbench.core.execution import DEFAULT_EXECUTION_KEY, execution_key
from gflbench.errors import UserError
from gflbench.experiments.records import config_key_of, run_key_of
from gflbench.experiments.spec import spec_of_record
from gflbench.experiments.store import (
    SCHEMA_VERSION,
    Imported,
    RunStore,
    differing_from_stored,
    disagreements,
    distinct,
    read_records,
)  # fmt: skip
from gflbench.experiments.upgrades import FIELDS_ADDED, upgrade_record

RECORDS = Path(__file__).resolve().parent.parent / "results" / "records"

GRID = ["run", "--method", "fedavg", "--dataset", "tiny", "--clients", "5", "--seeds", "6", "--rounds", "40"]


def _record(key: str, test: float = 0.5) -> dict:
    return {
        "run_key": key, "config_key": "c", "method": "fedavg", "dataset": "tiny", "scheme": "metis",
        "clients": 5, "data_seed": 1234, "seed": 0, "metric": "accuracy", "best_round": 0, "val": 0.5,
        "test": test, "val_weighted": 0.5, "test_weighted": 0.5, "seconds_per_round": [0.1, 0.3],
        "finished_at": time.time(),
    }  # fmt: skip


def _committed_record(method: str, lacking: str) -> dict:
    """A committed run of `method` as a gflbench from before the field `lacking` existed stored it: the field out
    of its configuration, its keys computed without it, no upgrade history."""
    old_value = FIELDS_ADDED[method][lacking]
    for path in sorted(RECORDS.glob("*.jsonl.gz")):
        for line in gzip.open(path, "rt", encoding="utf-8"):
            record = json.loads(line)
            if record["method"] == method and record["config"]["params"].get(lacking, old_value) == old_value:
                params = {k: v for k, v in record["config"]["params"].items() if k != lacking}
                config = {**record["config"], "params": params}
                config_key = config_key_of(config)
                run_key = run_key_of(config_key, record["dataset"], record["scheme"], record["clients"], record["seed"])
                stored = {k: v for k, v in record.items() if k != "upgrades"}
                return {**stored, "config": config, "config_key": config_key, "run_key": run_key}
    raise AssertionError(f"no committed {method} run with {lacking}={old_value}")


def test_put_is_idempotent_unless_replaced(tmp_path):
    with RunStore(tmp_path / "runs.sqlite") as store:
        store.put(_record("a", 0.5))
        store.put(_record("a", 0.9))
        assert len(store) == 1 and store.record("a")["test"] == 0.5
        store.put(_record("a", 0.9), replace=True)
        assert len(store) == 1 and store.record("a")["test"] == 0.9
        assert store.frame()["seconds_per_round"].tolist() == [pytest.approx(0.2)]


def test_a_schema_2_store_is_migrated_to_execution_keys_and_full_keys_keeping_every_run(tmp_path):
    """tests/golden/store-schema2.sqlite.gz was written by the store of schema 2 (run key alone as the primary
    key) from three committed records (FedAvg and FedIIH on Cora, FedIIH's sparse kernel on Minesweeper).
    Schema 3 keys them by execution; schema 4 re-keys the FedIIH Cora run, stored before its routing kernel was
    a field, with the kernel it ran with (gather); the other two already held every field and keep their keys."""
    path = tmp_path / "old.sqlite"
    path.write_bytes(gzip.decompress((Path(__file__).parent / "golden" / "store-schema2.sqlite.gz").read_bytes()))
    old = sqlite3.connect(path)
    before = old.execute("SELECT run_key, config_key, method, test, record FROM runs ORDER BY run_key").fetchall()
    assert old.execute("PRAGMA user_version").fetchone()[0] == 2
    assert "execution_key" not in {row[1] for row in old.execute("PRAGMA table_info(runs)")}
    old.close()
    params = {row[0]: json.loads(row[4])["config"]["params"] for row in before}
    lacking = [row for row in before if row[2] == "fediih" and "routing_kernel" not in params[row[0]]]
    assert len(lacking) == 1 and [row[2] for row in before].count("fediih") == 2  # the one run to re-key
    expected = {upgrade_record(json.loads(row[4]))["run_key"]: row for row in before}
    assert len(expected) == 3 and lacking[0][0] not in expected
    with RunStore(path) as store:
        assert sorted(store.frame()["run_key"]) == sorted(expected)
        for key, (old_key, old_config, _, test, text) in expected.items():
            record = store.record(key)
            assert record["test"] == test and record["curves"] == json.loads(text)["curves"]  # values unchanged
            if key == old_key:
                assert record == json.loads(text) and record["config_key"] == old_config
            else:
                assert record["config"]["params"]["routing_kernel"] == "gather" and record["config_key"] != old_config
                assert record["upgrades"] == [{"schema": 4, "filled": {"routing_kernel": "gather"},
                                               "run_key": old_key, "config_key": old_config}]  # fmt: skip
                assert spec_of_record(record).run_key == key  # the key today's spec gives
    migrated = sqlite3.connect(path)
    assert migrated.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
    executions = migrated.execute("SELECT DISTINCT execution_key FROM runs").fetchall()
    assert executions == [(DEFAULT_EXECUTION_KEY,)] == [("per-client/dense/alone/cpu",)]
    migrated.execute("UPDATE runs SET test = test + 0.01 WHERE rowid = (SELECT MIN(rowid) FROM runs)")
    migrated.commit()
    migrated.close()
    with pytest.raises(UserError, match="1 runs no longer match their checksum"):  # checksums were rewritten, and hold
        RunStore(path)


def test_a_schema_3_store_is_re_keyed_once_and_an_old_file_imports_under_the_new_keys(tmp_path):
    """A store of schema 3 holding an AdaFGL run from before `keep_best_epoch` existed: opening it fills the
    value the run had (True) and re-keys it, once (a second open changes nothing); an export file of the same
    old record imports into a new store under the same new key, and into the migrated one as a duplicate."""
    record = _committed_record("adafgl", lacking="keep_best_epoch")
    path = tmp_path / "v3.sqlite"
    with RunStore(path) as store:
        store.put(record)
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 3")  # as a schema-3 gflbench left it: the old key, the field absent
    db.commit()
    db.close()
    new_key = upgrade_record(record)["run_key"]
    assert new_key != record["run_key"]
    with RunStore(path) as store:
        assert record["run_key"] not in store and new_key in store
        upgraded = store.record(new_key)
        assert upgraded["config"]["params"]["keep_best_epoch"] is True
        assert spec_of_record(upgraded).params.keep_best_epoch is True
    with RunStore(path) as store:  # already at schema 4: nothing moves again
        assert list(store.frame()["run_key"]) == [new_key] and len(store.record(new_key)["upgrades"]) == 1
    old_file = tmp_path / "old.jsonl.gz"
    with gzip.open(old_file, "wt") as out:
        out.write(json.dumps(record) + "\n")
    (imported,) = read_records(old_file)
    assert imported.record["run_key"] == new_key and imported.record == upgraded
    assert differing_from_stored(RunStore(path), [imported.record]) == []


def test_two_executions_of_one_run_are_both_kept_and_tables_read_the_reference(tmp_path):
    per_client = {**_record("a", 0.5), "execution": "per-client", "device": "cpu"}
    batched = {**_record("a", 0.6), "execution": "batched", "stacked_runs": 3, "device": "cuda:0"}
    for order in ((batched, per_client), (per_client, batched)):  # whichever was stored first
        path = tmp_path / f"{order[0]['execution']}-first.sqlite"
        with RunStore(path) as store:
            for record in order:
                store.put(record)
            store.put({**batched, "test": 0.7})  # the same execution again: kept, not replaced
            assert len(store) == 2 and store.executions("a") == [
                "per-client/dense/alone/cpu",
                "batched/dense/stacked/cuda",
            ]
            assert store.record("a")["test"] == 0.5 and store.record("a", "batched/dense/stacked/cuda")["test"] == 0.6
            assert store.frame()["test"].tolist() == [0.5] and len(store.frame(every_execution=True)) == 2
            assert [r["test"] for r in store.records(["a"])] == [0.5]
            assert sorted(r["test"] for r in store.records(["a"], every_execution=True)) == [0.5, 0.6]
            assert sorted(r["test"] for r in store.records()) == [0.5, 0.6]  # what export writes: both


def test_a_run_on_another_cpu_is_another_execution_and_never_moves_the_stored_cell(tmp_path):
    """A CPU record that names its CPU (instruction set and digest) is keyed apart from the same run computed on
    another CPU and from a record written before CPUs were recorded; the table keeps reading the older record,
    and two machines that disagree are both kept, so their spread is measured. A GPU record names no CPU."""
    unnamed = {**_record("a", 0.5), "device": "cpu"}
    avx512 = {**_record("a", 0.6), "device": "cpu", "cpu": {"model": "X", "capability": "avx512", "digest": "1a2b3c4d"}}
    avx2 = {**avx512, "test": 0.7, "cpu": {"model": "Y", "capability": "avx2", "digest": "5e6f7a8b"}}
    cuda = {**avx512, "device": "cuda:0"}
    assert [execution_key(r) for r in (unnamed, avx512, avx2, cuda)] == [
        "per-client/dense/alone/cpu",
        "per-client/dense/alone/cpu/avx512-1a2b3c4d",
        "per-client/dense/alone/cpu/avx2-5e6f7a8b",
        "per-client/dense/alone/cuda",
    ]
    with RunStore(tmp_path / "runs.sqlite") as store:
        for record in (avx2, avx512, unnamed):  # the older record stored last: still the one tables read
            store.put(record)
        assert len(store) == 3 and store.frame()["test"].tolist() == [0.5]
        assert store.executions("a")[0] == "per-client/dense/alone/cpu"
    with RunStore(tmp_path / "named.sqlite") as store:
        for record in (avx2, avx512):  # no unnamed one: the keys' text decides, whatever the order stored
            store.put(record)
        assert store.frame()["test"].tolist() == [0.7]


def test_import_keeps_two_executions_of_a_run_and_refuses_one_execution_twice(tmp_path):
    per_client, batched = _record("a", 0.5), {**_record("a", 0.6), "execution": "batched"}
    read = [Imported(per_client, "f, line 1"), Imported(batched, "f, line 2"), Imported(dict(per_client), "g, line 1")]
    assert disagreements(read) == [] and [r["test"] for r in distinct(read)] == [0.5, 0.6]
    clash = disagreements([*read, Imported({**batched, "test": 0.9}, "h, line 1")])
    assert clash == ["a batched/dense/alone/cpu (f, line 2 vs h, line 1: test)"]


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
from gflbench.experiments.store import RunStore
after, put = int(sys.argv.pop(1)), RunStore.put

def put_then_hold(self, record, *args, **kwargs):
    put(self, record, *args, **kwargs)
    if after and len(self) >= after:
        time.sleep(3600)

RunStore.put = put_then_hold
from gflbench.commands.app import app
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
