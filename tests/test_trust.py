"""Issue 28, "Trust, second round", for the store, import and export: a computed run is never thrown
away, nothing damaged or mismatched is stored silently, and no file that is not ours is changed.

Each test names the defect it covers. The store and the files are driven through the command line,
as a user would; where a store must be unwritable or locked while a command runs, in a subprocess.
"""

from __future__ import annotations

import copy
import ctypes
import gzip
import json
import math
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from gflbench.commands.app import app
from gflbench.core.execution import DEFAULT_EXECUTION_KEY
from gflbench.errors import UserError
from gflbench.experiments.runner import DataCache, FederatedData, run
from gflbench.experiments.spec import make_spec
from gflbench.experiments.store import _COLUMNS, RunStore, _checksum, read_records

ROOT = Path(__file__).resolve().parent.parent
CODE = "import sys; from gflbench.commands.app import app; sys.argv[0] = 'gflbench'; app()"
TINY = ["-d", "tiny", "--clients", "5", "--rounds", "3", "--device", "cpu"]


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("GFLBENCH_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("GFLBENCH_LOCK_WAIT", "1")
    monkeypatch.delenv("GFLBENCH_RESULTS", raising=False)
    return tmp_path


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> Path:
    """A store with four finished tiny runs (Local and FedAvg, seeds 0 and 1), made once for this file."""
    folder = tmp_path_factory.mktemp("stored")
    store = folder / "runs.sqlite"
    os.environ.setdefault("GFLBENCH_DATA", str(folder / "data"))
    result = CliRunner().invoke(app, ["run", "-m", "local,fedavg", *TINY, "--seeds", "2", "--store", str(store)])
    assert result.exit_code == 0, result.output
    return store


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _one_error(result, *needles: str) -> str:
    """Exit 2 with one line on stderr that holds every needle; the line, for further checks."""
    lines = _lines(result.stderr)
    assert result.exit_code == 2 and len(lines) == 1, result.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _strict(text: str) -> object:
    """JSON as RFC 8259 has it: NaN and Infinity are not numbers there."""

    def refuse(token: str) -> None:
        raise ValueError(f"non-finite token {token}")

    return json.loads(text, parse_constant=refuse)


def _exported(store: Path, out: Path) -> list[dict]:
    """The store's records as `gflbench export` writes them (plain JSON Lines), one dict per line."""
    assert _cli("export", str(out), "--store", str(store)).exit_code == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def _write_lines(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    return path


# 1. NaN locks the whole store ------------------------------------------------------------------


def test_1_clients_without_nodes_are_left_out_counted_and_stored_as_null(env):
    """50 clients on tiny: some hold no validation or test node. Their values are null, the record
    counts them, the client mean leaves them out, and the store stays readable (table, export, import)."""
    store = env / "s.sqlite"
    result = _cli("run", "-m", "fedavg", "-d", "tiny", "--clients", "50", "--seeds", "1", "--rounds", "2",
                  "--device", "cpu", "--store", str(store))  # fmt: skip
    assert result.exit_code == 0, result.output
    graphs = DataCache(None, None).federated("tiny", "metis", 50, 1234).graphs
    empty = {split: [int(getattr(g, f"{split}_mask").sum()) == 0 for g in graphs] for split in ("val", "test")}
    assert any(empty["test"])  # the setting this test is about
    with sqlite3.connect(store) as db:
        (text,) = db.execute("SELECT record FROM runs").fetchone()
    record = _strict(text)
    assert record["excluded_clients"] == {split: sum(flags) for split, flags in empty.items()}
    for split, flags in empty.items():
        for row in record["client_curves"][split]:
            assert [value is None for value in row] == flags
            kept = [value for value in row if value is not None]
            assert all(math.isfinite(value) for value in kept)
        best = record["best_round"]
        kept = [v for v in record["client_curves"][split][best] if v is not None]
        assert record[split] == pytest.approx(sum(kept) / len(kept), abs=1e-6)
    later = _cli("run", "-m", "fedavg", "-d", "tiny", "--clients", "5", "--seeds", "1", "--rounds", "2", "--device", "cpu",
                 "--store", str(store))  # fmt: skip
    assert later.exit_code == 0 and "This grid" in later.stdout, later.output  # its summary reads the store
    assert _cli("table", "--dataset", "tiny", "--rounds", "2", "--store", str(store)).exit_code == 0
    exported = env / "runs.jsonl.gz"
    assert _cli("export", str(exported), "--store", str(store)).exit_code == 0
    with gzip.open(exported, "rt") as file:
        _strict(file.read().splitlines()[0])
    fresh = env / "fresh.sqlite"
    assert _cli("import", str(exported), "--store", str(fresh)).exit_code == 0
    dry = _cli("sweep", "--dry-run", "-m", "fedavg", "-d", "tiny", "--clients", "50", "--seeds", "1", "--rounds", "2",
               "--store", str(fresh))  # fmt: skip
    assert dry.exit_code == 0 and "1 runs in the grid, 0 missing" in dry.stdout, dry.output


def test_1_a_roc_auc_client_whose_split_lacks_a_class_is_left_out(tiny_federation, cpu, tmp_path):
    """On a ROC-AUC dataset a client whose labels are all one class has no AUC: it is left out of both
    client means and counted, and the record is still finite JSON."""
    graphs = []
    for cid, graph in enumerate(tiny_federation.graphs):
        g = copy.copy(graph)
        g.y = torch.zeros_like(graph.y) if cid == 0 else (graph.y % 2)
        graphs.append(g)
    data = FederatedData("tiny", "roc_auc", tiny_federation.num_features, 2, tiny_federation.partition, graphs)
    record = run(make_spec("fedavg", "tiny", "metis", 5, 0, rounds=2), data, cpu)
    lacking = {
        split: [len(set(g.y[getattr(g, f"{split}_mask")].tolist())) < 2 for g in graphs] for split in ("val", "test")
    }
    assert lacking["test"][0] and not all(lacking["test"])
    assert record["excluded_clients"] == {split: sum(flags) for split, flags in lacking.items()}
    assert [v is None for v in record["client_curves"]["test"][1]] == lacking["test"] and math.isfinite(record["test"])
    with RunStore(tmp_path / "s.sqlite") as store:
        store.put(record)
        assert store.frame()["test"].tolist() == [record["test"]]


@pytest.mark.parametrize("metric", ["accuracy", "roc_auc"])
def test_1_a_setting_no_client_can_measure_is_refused_up_front(tiny_federation, metric):
    graphs = []
    for graph in tiny_federation.graphs:
        g = copy.copy(graph)
        if metric == "accuracy":
            g.test_mask = torch.zeros_like(graph.test_mask)  # no client has a test node
        else:
            g.y = torch.ones_like(graph.y)  # every split of every client lacks class 0
        graphs.append(g)
    data = FederatedData("tiny", metric, tiny_federation.num_features, 2, tiny_federation.partition, graphs)
    from gflbench.experiments.runner import check_measurable

    with pytest.raises(UserError, match="tiny metis-5: no client"):
        check_measurable(data)
    check_measurable(tiny_federation)  # the real setting is measurable


def test_1_a_legacy_record_holding_nan_is_read_and_marked(tmp_path):
    """Records written before this change may hold NaN tokens, which SQLite's JSON functions reject:
    the store reads them anyway and marks them (`non_finite`); an export writes them as null."""
    path = tmp_path / "old.sqlite"
    good = {"run_key": "good", "config_key": "c", "method": "fedavg", "dataset": "tiny", "scheme": "metis",
            "clients": 2, "data_seed": 1234, "seed": 0, "metric": "accuracy", "status": "ok", "best_round": 0,
            "val": 0.5, "test": 0.5, "val_weighted": 0.5, "test_weighted": 0.5, "finished_at": 1.0,
            "client_curves": {"val": [[0.5, 0.5]], "test": [[0.5, 0.5]]}}  # fmt: skip
    with RunStore(path) as store:
        store.put(good)
    legacy = {**good, "run_key": "legacy", "client_curves": {"val": [[0.5, math.nan]], "test": [[0.5, math.nan]]}}
    record = json.dumps(legacy, sort_keys=True)  # as gflbench wrote it
    row = {**{c: legacy.get(c) for c in _COLUMNS}, "execution_key": DEFAULT_EXECUTION_KEY, "record": record}
    row["checksum"] = _checksum(list(row.values()))
    with sqlite3.connect(path) as db:
        db.execute(f"INSERT INTO runs ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})", tuple(row.values()))
    with RunStore(path) as store:
        frame = store.frame().set_index("run_key")
        assert frame.loc["legacy", "non_finite"] and not frame.loc["good", "non_finite"]
        assert frame.loc["legacy", "test"] == 0.5
    out = tmp_path / "out.jsonl"
    result = _cli("export", str(out), "--store", str(path))
    assert result.exit_code == 0, result.output
    exported = {r["run_key"]: r for r in map(_strict, out.read_text().splitlines())}
    assert exported["legacy"]["client_curves"]["val"] == [[0.5, None]]


def test_1_import_refuses_non_finite_numbers_naming_file_and_line(env, stored):
    records = _exported(stored, env / "all.jsonl")
    records[1]["client_curves"]["val"][0][0] = math.nan  # json.dumps writes the token NaN
    broken = _write_lines(env / "nan.jsonl", records)
    fresh = env / "fresh.sqlite"
    result = _cli("import", str(broken), "--store", str(fresh))
    _one_error(result, str(broken), "line 2", "NaN")
    assert not fresh.exists() or len(RunStore(fresh)) == 0


# 4. A read-only store ----------------------------------------------------------------------------


def _without_root_override() -> None:
    """In the child: drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the bounding set, so that after
    exec even root obeys file modes (a read-only store is read-only for root too, as for a user)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # 24 = PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _can_drop_root_override() -> bool:
    if os.geteuid() != 0:
        return True  # file modes bind already
    probe = subprocess.run([sys.executable, "-c", "pass"], preexec_fn=_without_root_override, capture_output=True)
    return probe.returncode == 0


def _command(args: list[str], store: Path, tmp_path: Path, **kwargs) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "GFLBENCH_RESULTS"}
    env.update(GFLBENCH_DATA=str(tmp_path / "data"), GFLBENCH_LOCK_WAIT="2")
    return subprocess.Popen([sys.executable, "-c", CODE, *args, "--store", str(store)], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)  # fmt: skip


@pytest.mark.skipif(not _can_drop_root_override(), reason="root here cannot give up its override of file modes")
def test_4_a_read_only_store_is_refused_before_any_run(tmp_path, stored):
    store = tmp_path / "ro.sqlite"
    shutil.copy(stored, store)
    with sqlite3.connect(store) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.chmod(0o444)
    before = store.read_bytes()
    proc = _command(["run", "-m", "fedavg", *TINY, "--seeds", "3"], store, tmp_path, preexec_fn=_without_root_override)
    out, err = proc.communicate(timeout=300)
    lines = _lines(err)
    assert proc.returncode == 2 and len(lines) == 1 and str(store) in lines[0] and "read-only" in lines[0], err
    assert "to run" not in out  # refused before the grid started
    assert store.read_bytes() == before


# 5. A store locked by another writer -------------------------------------------------------------


def test_5_a_store_locked_before_the_grid_is_waited_for_then_refused(env, stored):
    store = env / "locked.sqlite"
    shutil.copy(stored, store)
    holder = sqlite3.connect(store, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # an open sqlite3 shell or DB browser with a pending write
    try:
        started = time.time()
        result = _cli("run", "-m", "fedavg", *TINY, "--seeds", "3", "--store", str(store))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert "waiting" in result.stderr and time.time() - started < 60
    assert result.exit_code == 2 and str(store) in _lines(result.stderr)[-1] and "locked" in _lines(result.stderr)[-1]
    assert "to run" not in result.stdout
    with RunStore(store) as runs:
        assert len(runs) == 4


def test_5_a_run_finished_while_the_store_is_locked_is_spooled_and_imports(tmp_path):
    """The store is locked after the first run is stored: the later runs wait (GFLBENCH_LOCK_WAIT, 2 s
    here), are written to a side file the command names, and `gflbench import` of it completes the store."""
    store = tmp_path / "runs.sqlite"
    proc = _command(["run", "-m", "fedavg", "-d", "tiny", "--clients", "5", "--rounds", "150", "--seeds", "3",
                     "--device", "cpu"], store, tmp_path)  # fmt: skip
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if store.exists():
            with sqlite3.connect(store) as db:
                try:
                    if db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] >= 1:
                        break
                except sqlite3.OperationalError:
                    pass
        time.sleep(0.02)
    holder = sqlite3.connect(store, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        _out, err = proc.communicate(timeout=300)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert proc.returncode == 1, err
    spools = sorted(tmp_path.glob("runs.sqlite.spool-*.jsonl.gz"))
    assert len(spools) == 1 and "waiting" in err and str(spools[0]) in _lines(err)[-1], err
    with RunStore(store) as runs:
        in_store = len(runs)
    result = _cli("import", str(spools[0]), "--store", str(store))
    assert result.exit_code == 0, result.output
    with RunStore(store) as runs:
        assert in_store >= 1 and len(runs) == 3 and sorted(runs.frame()["seed"]) == [0, 1, 2]


def test_5_ctrl_c_while_waiting_for_the_lock_spools_the_run(tmp_path, monkeypatch, stored):
    import gflbench.experiments.store.database as store_module  # the module RunStore reads these names in

    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    (record, *_) = RunStore(stored).records()
    monkeypatch.setattr(store_module, "_ATTEMPT_SECONDS", 0.1)
    monkeypatch.setattr(store_module.time, "sleep", interrupted)  # Ctrl-C lands in the back-off
    notes: list[str] = []
    runs = RunStore(tmp_path / "runs.sqlite", notes.append)
    holder = sqlite3.connect(tmp_path / "runs.sqlite", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(KeyboardInterrupt):
            runs.put(record)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert "waiting" in notes[0] and str(runs.spool) in notes[1]
    assert [item.record for item in read_records(runs.spool)] == [record]


# 6. Another application's SQLite file ------------------------------------------------------------


@pytest.mark.parametrize("schema", ["CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)",
                                    "CREATE TABLE runs (id INTEGER PRIMARY KEY, name TEXT)"])  # fmt: skip
@pytest.mark.parametrize("command", ["run", "table", "import"])
def test_6_a_foreign_sqlite_file_is_refused_and_left_byte_for_byte(env, stored, schema, command):
    foreign = env / "app.sqlite"
    with sqlite3.connect(foreign) as db:
        db.executescript(f"{schema}; INSERT INTO {schema.split()[2]} VALUES (1, 'x'); PRAGMA user_version = 7;")
    before = foreign.read_bytes()
    args = {"run": ["run", "-m", "fedavg", *TINY, "--seeds", "1"], "table": ["table", "--dataset", "tiny"],
            "import": ["import", str(env / "all.jsonl")]}[command]  # fmt: skip
    if command == "import":
        _exported(stored, env / "all.jsonl")
    result = _cli(*args, "--store", str(foreign))
    _one_error(result, str(foreign), "not a gflbench run store")
    assert foreign.read_bytes() == before
    assert sorted(p.name for p in env.iterdir() if p.name.startswith("app.sqlite")) == ["app.sqlite"]  # no -wal


def test_6_an_empty_sqlite_file_becomes_a_store(env):
    empty = env / "empty.sqlite"
    sqlite3.connect(empty).close()
    with sqlite3.connect(empty) as db:
        db.execute("VACUUM")  # a valid database file with no schema
    result = _cli("run", "-m", "fedavg", *TINY, "--seeds", "1", "--store", str(empty))
    assert result.exit_code == 0, result.output


# 7. Export writes only regular files -------------------------------------------------------------


def _special_targets(folder: Path) -> dict[str, Path]:
    victim = folder / "victim.txt"
    victim.write_text("keep me")
    targets = {"symlink": folder / "link.jsonl"}
    targets["symlink"].symlink_to(victim)
    targets["fifo"] = folder / "pipe.jsonl"
    os.mkfifo(targets["fifo"])
    try:
        targets["device"] = folder / "null.jsonl"
        os.mknod(targets["device"], stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a /dev/null of our own
    except (PermissionError, OSError):
        targets.pop("device")
    (folder / "file").write_text("a file, not a folder")
    targets["parent is a file"] = folder / "file" / "out.jsonl"
    return targets


def test_7_export_refuses_a_target_that_is_not_a_regular_file(env, stored):
    for kind, target in _special_targets(env).items():
        kind_before = target.lstat().st_mode if kind != "parent is a file" else None
        result = _cli("export", str(target), "--store", str(stored))
        _one_error(result, str(target))
        if kind_before is not None:
            assert target.lstat().st_mode == kind_before, kind  # still a link, FIFO or device
    assert (env / "victim.txt").read_text() == "keep me"
    assert not list(env.glob("*.partial")) and (env / "file").read_text() == "a file, not a folder"


# 8. Import re-validates every record -------------------------------------------------------------


def _tampered(env: Path, stored: Path, change) -> tuple[object, Path]:
    records = _exported(stored, env / "all.jsonl")
    change(records[2])
    path = _write_lines(env / "tampered.jsonl", records)
    fresh = env / "fresh.sqlite"
    result = _cli("import", str(path), "--store", str(fresh))
    assert not fresh.exists() or len(RunStore(fresh)) == 0  # nothing stored
    return result, path


def test_8_a_changed_test_value_is_refused(env, stored):
    def change(record: dict) -> None:
        record["test"] -= 0.35

    result, path = _tampered(env, stored, change)
    line = _one_error(result, str(path), "test")
    assert "line 3" in line and str(path) in line, line


def test_8_a_changed_client_curve_is_refused(env, stored):
    def change(record: dict) -> None:
        best = record["best_round"]
        record["client_curves"]["test"][best][0] = 1.0 - record["client_curves"]["test"][best][0]

    result, path = _tampered(env, stored, change)
    line = _one_error(result, str(path), "client")
    assert "line 3" in line and str(path) in line, line


def test_8_a_changed_seed_under_the_old_run_key_is_refused(env, stored):
    def change(record: dict) -> None:
        record["seed"] = 7

    result, path = _tampered(env, stored, change)
    line = _one_error(result, str(path), "run key")
    assert "line 3" in line and str(path) in line, line


def test_8_a_record_with_only_the_old_required_fields_is_refused(env, stored):
    def change(record: dict) -> None:
        for name in list(record):
            if name not in ("run_key", "config_key", "method", "dataset", "scheme", "clients", "data_seed", "seed",
                            "metric", "finished_at"):  # fmt: skip
                del record[name]

    result, path = _tampered(env, stored, change)
    line = _one_error(result, str(path), "config")
    assert "line 3" in line and str(path) in line, line


def test_8_two_files_that_disagree_on_a_run_are_listed_and_nothing_is_stored(env, stored):
    records = _exported(stored, env / "all.jsonl")
    first = _write_lines(env / "a.jsonl", records[:3])
    other = copy.deepcopy(records[2])
    other["bytes_up"] = [b + 1 for b in other["bytes_up"]]  # self-consistent, but not the same run's numbers
    second = _write_lines(env / "b.jsonl", [other, records[3]])
    fresh = env / "fresh.sqlite"
    result = _cli("import", str(first), str(second), "--store", str(fresh))
    _one_error(result, records[2]["run_key"], f"{first}, line 3", f"{second}, line 1", "disagree")
    assert not fresh.exists() or len(RunStore(fresh)) == 0
    older = {
        k: v for k, v in records[2].items() if k not in ("excluded_clients", "data_fingerprint")
    }  # as written before
    same = _cli("import", str(first), str(_write_lines(env / "c.jsonl", [older, records[3]])), "--store", str(fresh))
    assert same.exit_code == 0 and "imported 4 new runs" in same.output and "0 were already stored" in same.output


def test_8_an_import_differing_from_the_stored_run_keeps_it_and_says_so(env, stored):
    store = env / "runs.sqlite"
    shutil.copy(stored, store)
    records = _exported(store, env / "all.jsonl")
    records[0]["bytes_down"] = [b + 1 for b in records[0]["bytes_down"]]
    result = _cli("import", str(_write_lines(env / "x.jsonl", records)), "--store", str(store))
    assert result.exit_code == 0 and records[0]["run_key"] in result.stderr and "kept" in result.stderr
    with RunStore(store) as runs:
        assert runs.record(records[0]["run_key"])["bytes_down"] != records[0]["bytes_down"]


def test_8_the_committed_records_import_whole(env):
    files = sorted((ROOT / "results" / "records").glob("*.jsonl.gz"))
    if not files:
        pytest.skip("no committed records")
    expected = set()
    for path in files:
        with gzip.open(path, "rt") as file:
            expected |= {json.loads(line)["run_key"] for line in file if line.strip()}
    result = _cli("import", *map(str, files), "--store", str(env / "all.sqlite"))
    assert result.exit_code == 0, result.output
    with RunStore(env / "all.sqlite") as runs:
        assert set(runs.frame()["run_key"]) == expected


# Low: `.partial` files left by a kill are never removed ------------------------------------------

DEAD_PID = 2**22 + 1  # above Linux's largest pid: no process has it


def _host() -> str:
    import socket

    return socket.gethostname().replace(".", "_")


def test_low_an_export_killed_midway_leaves_nothing_after_the_next_export(env, stored):
    """An export writes `.<name>.<host>-<pid>.partial` and renames it; a kill in between leaves that file. The next
    export to the name removes the leftovers of dead processes and nothing else in the user's folder."""
    out = env / "runs.jsonl.gz"
    dead = [env / f".runs.jsonl.gz.{_host()}-{DEAD_PID}.partial", env / f".runs.jsonl.gz.{DEAD_PID}.partial"]
    kept = [
        env / f".runs.jsonl.gz.{_host()}-{os.getppid()}.partial",  # a live writer's
        env / f".runs.jsonl.gz.another_host-{DEAD_PID}.partial",  # another machine's: cannot tell from here
        env / f".other.jsonl.gz.{_host()}-{DEAD_PID}.partial",  # another name's: left to its own next export
        env / f"notes.{DEAD_PID}.partial",  # the user's own file
    ]
    for path in (*dead, *kept):
        path.write_bytes(b"half a file")
    result = _cli("export", str(out), "--store", str(stored))
    assert result.exit_code == 0, result.output
    assert not any(path.exists() for path in dead) and all(path.exists() for path in kept)
    assert len(read_records(out)) == 4 and not list(env.glob(f".runs.jsonl.gz.{_host()}-{os.getpid()}.partial"))


def test_low_a_tuned_file_write_removes_what_a_killed_tune_left(tmp_path):
    from gflbench.experiments.protocol import write_tuned

    folder = tmp_path / "tuned"
    folder.mkdir()
    dead = [
        folder / f"tiny-metis-5.json.{DEAD_PID}.partial",
        folder / f"tiny-metis-5.json.{_host()}-{DEAD_PID}.partial",
    ]
    alive = folder / f"tiny-metis-5.json.{_host()}-{os.getppid()}.partial"
    for path in (*dead, alive):
        path.write_text("{")
    write_tuned(folder, "tiny", "metis", 5, "fedavg", {"values": {"lr": 0.02}})
    assert not any(path.exists() for path in dead) and alive.exists()
    assert json.loads((folder / "tiny-metis-5.json").read_text())["methods"]["fedavg"]["values"] == {"lr": 0.02}


def test_low_a_non_finite_value_in_a_tuned_file_names_the_file_and_says_it_must_be_finite(env):
    """JSON's `Infinity` token in a tuned file: one line naming the file and what is wrong with the value."""
    path = env / "tuned" / "tiny-metis-5.json"
    path.parent.mkdir()
    path.write_text(
        '{"dataset": "tiny", "scheme": "metis", "clients": 5, "methods": {"fedavg": {"values": {"lr": Infinity}}}}'
    )
    result = _cli("run", "-m", "fedavg", *TINY, "--seeds", "1", "--protocol", "fair", "--tuned-dir", str(path.parent),
                  "--store", str(env / "runs.sqlite"))  # fmt: skip
    _one_error(result, str(path), "fedavg.lr=inf is out of range: it must be a finite number > 0")
    assert not (env / "runs.sqlite").exists()


def test_1_tune_refuses_a_setting_no_client_can_measure_before_any_trial(env, monkeypatch):
    """`gflbench tune` checks what `run` checks (`runner.check_measurable`) for every setting before its first
    trial: one line, exit 2, no study and no tuned file."""
    measured = DataCache.federated

    def without_test_nodes(self, *args):
        data = measured(self, *args)
        for graph in data.graphs:
            graph.test_mask = torch.zeros_like(graph.test_mask)  # no client has a test node
        return data

    monkeypatch.setattr(DataCache, "federated", without_test_nodes)
    store, tuned = env / "runs.sqlite", env / "tuned"
    result = _cli("tune", "-m", "fedavg", *TINY, "--trials", "1", "--no-prune", "--store", str(store),
                  "--tuned-dir", str(tuned))  # fmt: skip
    _one_error(result, "tiny metis-5: no client has test nodes")
    assert not (env / "tuning.sqlite").exists() and not tuned.exists()


def test_8_an_import_of_the_same_run_on_other_processed_data_is_listed_as_a_conflict(env, stored):
    """Same run key, same config, same curves, but another `data_fingerprint` (the run was computed on other
    processed data): against the stored run it is kept and listed, naming the field; between two imported
    files it is a disagreement, and nothing is imported."""
    store = env / "runs.sqlite"
    shutil.copy(stored, store)
    records = _exported(store, env / "all.jsonl")
    assert all(r["data_fingerprint"] for r in records)
    other = copy.deepcopy(records[1])
    other["data_fingerprint"] = "0" * 64
    result = _cli("import", str(_write_lines(env / "other.jsonl", [other])), "--store", str(store))
    assert result.exit_code == 0, result.output
    (line,) = _lines(result.stderr)
    assert other["run_key"] in line and "data_fingerprint (other processed data)" in line and "kept" in line
    with RunStore(store) as runs:
        assert runs.record(other["run_key"])["data_fingerprint"] == records[1]["data_fingerprint"]
    fresh = env / "fresh.sqlite"
    both = _cli("import", str(env / "all.jsonl"), str(env / "other.jsonl"), "--store", str(fresh))
    _one_error(both, other["run_key"], "disagree", "data_fingerprint (other processed data)")
    assert not fresh.exists() or len(RunStore(fresh)) == 0
