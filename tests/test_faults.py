"""The promise "a finished run is never lost or duplicated", and clear errors on damaged inputs, as tests.

Each test drives the real command line in separate processes, the way a user or a cluster job would.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gflbench.data.partition import cached_partition
from gflbench.experiments.runner import DataCache
from gflbench.experiments.store import RunStore

ROOT = Path(__file__).resolve().parent.parent
CODE = "import sys; from gflbench.commands.app import app; sys.argv[0] = 'gflbench'; app()"
SWEEP = [
    "sweep",
    "-m",
    "fedavg,local",
    "-d",
    "tiny",
    "--clients",
    "5",
    "--seeds",
    "4",
    "--rounds",
    "30",
    "--workers",
    "2",
]


def _start(args: list[str], tmp_path: Path, store: Path) -> subprocess.Popen:
    env = dict(os.environ)
    env["GFLBENCH_DATA"] = str(tmp_path / "data")
    return subprocess.Popen(
        [sys.executable, "-c", CODE, *args, "--store", str(store), "--device", "cpu"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )  # fmt: skip  (its own process group: kill it whole)


def _stored(store: Path) -> dict[str, float]:
    """run_key -> finished_at, read the way a second process would; {} before the store exists."""
    if not store.exists():
        return {}
    with sqlite3.connect(store) as db:
        try:
            return dict(db.execute("SELECT run_key, finished_at FROM runs").fetchall())
        except sqlite3.OperationalError:
            return {}


def _integrity(store: Path) -> str:
    with sqlite3.connect(store) as db:
        return db.execute("PRAGMA integrity_check").fetchone()[0]


def test_sigkill_of_a_parallel_sweep_at_random_moments_loses_and_duplicates_nothing(tmp_path):
    store, rng = tmp_path / "runs.sqlite", random.Random(7)
    finished: dict[str, float] = {}
    for _ in range(int(os.environ.get("GFLBENCH_SOAK_KILLS", "5"))):  # bench/soak_kill.sh asks for more
        proc = _start(SWEEP, tmp_path, store)
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None and len(_stored(store)) <= len(finished):
            time.sleep(0.05)  # wait for this attempt's first stored run, then kill a random moment later
        time.sleep(rng.uniform(0.0, 1.5))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        now = _stored(store)
        assert _integrity(store) == "ok"
        assert all(now[key] == at for key, at in finished.items())  # nothing finished before was recomputed
        with RunStore(store) as runs:
            for record in runs.records():
                assert record["status"] == "ok" and len(record["curves"]["val"]) == 30  # no partial record
        finished = now
    done = _start(SWEEP, tmp_path, store)
    out, _ = done.communicate(timeout=600)
    assert done.returncode == 0, out
    final = _stored(store)
    assert len(final) == 8 and all(final[key] == at for key, at in finished.items())
    with sqlite3.connect(store) as db:
        assert db.execute("SELECT COUNT(*), COUNT(DISTINCT run_key) FROM runs").fetchone() == (8, 8)


def test_two_processes_on_one_store_store_each_run_once(tmp_path):
    store = tmp_path / "runs.sqlite"
    a = _start(
        ["run", "-m", "fedavg", "-d", "tiny", "--clients", "5", "--seeds", "3", "--rounds", "10"], tmp_path, store
    )
    b = _start(
        ["run", "-m", "fedavg,local", "-d", "tiny", "--clients", "5", "--seeds", "2", "--rounds", "10"], tmp_path, store
    )
    for proc in (a, b):
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out
    with sqlite3.connect(store) as db:
        rows = db.execute("SELECT method, seed FROM runs ORDER BY method, seed").fetchall()
    assert rows == [("fedavg", 0), ("fedavg", 1), ("fedavg", 2), ("local", 0), ("local", 1)]
    assert _integrity(store) == "ok"


def test_same_seed_in_two_processes_gives_identical_records(tmp_path):
    records = []
    for name in ("a", "b"):
        store = tmp_path / f"{name}.sqlite"
        proc = _start(["run", "-m", "fedavg,fedpub", "-d", "tiny", "--clients", "5", "--seeds", "1", "--rounds", "6"],
                      tmp_path, store)  # fmt: skip
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out
        with RunStore(store) as runs:
            records.append(sorted(runs.records(), key=lambda r: r["method"]))
    timing = {"seconds_per_round", "first_round_seconds", "seconds_per_phase", "peak_memory_bytes", "started_at",
              "finished_at"}  # fmt: skip
    for first, second in zip(*records):
        same = {k: v for k, v in first.items() if k not in timing}
        assert json.dumps(same, sort_keys=True) == json.dumps({k: second[k] for k in same}, sort_keys=True)


def test_a_non_finite_loss_is_stored_as_failed_and_the_grid_goes_on(tmp_path):
    store = tmp_path / "runs.sqlite"
    proc = _start(["run", "-m", "fedavg,local", "-d", "tiny", "--clients", "5", "--seeds", "1", "--rounds", "5",
                   "--set", "fedavg.lr=1e30"], tmp_path, store)  # fmt: skip
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 1
    assert out.strip().splitlines()[-1].startswith("1 runs of this grid are stored as failed")
    with RunStore(store) as runs:
        by_method = {r["method"]: r for r in runs.records()}
    assert by_method["local"]["status"] == "ok"  # the grid went on
    assert (
        by_method["fedavg"]["status"] == "failed" and "non-finite predictions at round" in by_method["fedavg"]["error"]
    )
    listing = subprocess.run([sys.executable, "-c", CODE, "failed", "--store", str(store)], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    text = listing.stdout
    assert "fedavg tiny metis-5 seed 0 protocol paper: RunFailed: non-finite predictions at round" in text


@pytest.mark.parametrize("where", ["header", "schema", "inside a record"])
def test_a_damaged_store_is_refused_by_name_and_left_untouched(tmp_path, where):
    store = tmp_path / "runs.sqlite"
    first = _start(
        ["run", "-m", "fedavg", "-d", "tiny", "--clients", "5", "--seeds", "2", "--rounds", "3"], tmp_path, store
    )
    first.communicate(timeout=300)
    with sqlite3.connect(store) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    damaged = bytearray(store.read_bytes())
    # garbage where SQLite's own check sees it (header, schema page) and where only the row checksums do
    offset = {"header": 0, "schema": 100, "inside a record": damaged.find(b'"curves"')}[where]
    damaged[offset : offset + 200] = bytes(random.Random(offset).getrandbits(8) for _ in range(200))
    store.write_bytes(bytes(damaged))
    proc = _start(
        ["run", "-m", "fedavg", "-d", "tiny", "--clients", "5", "--seeds", "4", "--rounds", "3"], tmp_path, store
    )
    out, _ = proc.communicate(timeout=300)
    lines = [line for line in out.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and str(store) in lines[0] and "damaged" in lines[0], out
    assert store.read_bytes() == bytes(damaged)  # nothing written into it


def test_a_store_from_a_newer_gflbench_is_refused(tmp_path):
    store = tmp_path / "runs.sqlite"
    with sqlite3.connect(store) as db:
        db.execute("PRAGMA user_version = 99")
        db.execute("CREATE TABLE runs (run_key TEXT PRIMARY KEY)")
    proc = _start(
        ["run", "-m", "fedavg", "-d", "tiny", "--clients", "5", "--seeds", "1", "--rounds", "3"], tmp_path, store
    )
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 2 and "newer gflbench (schema 99" in out and str(store) in out


def test_a_damaged_partition_cache_file_is_rebuilt_not_trusted(tmp_path):
    cache = DataCache(None, None)
    graph = cache.graph("tiny")
    folder = tmp_path / "partitions"
    original = cached_partition(graph, "tiny", "metis", 5, 1234, (0.2, 0.4, 0.4), folder)
    (path,) = (folder / "tiny").glob("*.pt")
    stored = torch.load(path)
    stored["split"] = torch.zeros_like(stored["split"])  # loads fine, wrong content
    torch.save(stored, path)
    assert cached_partition(graph, "tiny", "metis", 5, 1234, (0.2, 0.4, 0.4), folder).digest() == original.digest()
    path.write_bytes(b"garbage")  # does not load at all
    assert cached_partition(graph, "tiny", "metis", 5, 1234, (0.2, 0.4, 0.4), folder).digest() == original.digest()
    assert torch.load(path)["digest"] == original.digest()  # rewritten


def _cora_mirror(tmp_path: Path) -> Path:
    import shutil

    source = Path(os.environ.get("GFLBENCH_RAW_MIRROR", ROOT.parent / "shared" / "data")) / "Cora"
    if not source.is_dir():
        pytest.skip("the Cora raw files are not in GFLBENCH_RAW_MIRROR")
    mirror = tmp_path / "mirror"
    shutil.copytree(source, mirror / "Cora")
    return mirror


def _partitions(tmp_path: Path, mirror: Path, data: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "GFLBENCH_RAW_MIRROR": str(mirror), "GFLBENCH_DATA": str(data)}
    return subprocess.run([sys.executable, "-c", CODE, "partitions", "-d", "cora", "--clients", "5"], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=600)  # fmt: skip


def test_a_truncated_raw_file_is_named_and_a_fixed_mirror_is_copied_again(tmp_path):
    mirror = _cora_mirror(tmp_path)
    graph = mirror / "Cora" / "raw" / "ind.cora.graph"
    good = graph.read_bytes()
    graph.write_bytes(good[: len(good) // 3])
    data = tmp_path / "data"
    broken = _partitions(tmp_path, mirror, data)
    lines = [line for line in broken.stderr.splitlines() if line.strip()]
    assert broken.returncode == 2 and len(lines) == 1 and str(data / "Cora") in lines[0] and "corrupted" in lines[0]
    graph.write_bytes(good)  # the mirror is fixed: the stale copy in the data directory must not stick
    fixed = _partitions(tmp_path, mirror, data)
    assert fixed.returncode == 0, fixed.stderr
    assert "Processing" not in fixed.stdout + fixed.stderr  # PyG's messages only with --verbose
    assert (data / "Cora" / "raw" / "ind.cora.graph").read_bytes() == good


def test_an_unwritable_data_directory_is_one_clear_line(tmp_path):
    """The data directory cannot take the copy (a file in its place: unwritable even for root, as CI runs)."""
    mirror = _cora_mirror(tmp_path)
    data = tmp_path / "data"
    data.write_text("not a folder")
    result = _partitions(tmp_path, mirror, data)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "writable" in lines[0] and str(data) in lines[0], (
        result.stderr
    )


def test_sigterm_of_a_parallel_sweep_closes_like_ctrl_c_and_resumes(tmp_path):
    """A batch system's stop (SIGTERM to the driver alone): one line, exit 143, no worker left computing,
    no leaked-semaphore warning, and a rerun completes the grid without redoing what was stored."""
    store = tmp_path / "runs.sqlite"
    grid = [*SWEEP[: SWEEP.index("--rounds")], "--rounds", "100", "--workers", "2"]
    proc = _start(grid, tmp_path, store)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not _stored(store):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    lines = [line for line in out.splitlines() if line.strip()]
    assert proc.returncode == 143, out
    assert lines[-1] == "interrupted; every finished run is stored, rerun the same command to resume", out
    assert "leaked" not in out and "Traceback" not in out
    deadline = time.time() + 30
    while time.time() < deadline:  # the workers (its own process group) end with it
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("a worker outlived its driver")
    kept = _stored(store)
    done = _start(grid, tmp_path, store)
    out, _ = done.communicate(timeout=600)
    assert done.returncode == 0, out
    final = _stored(store)
    assert len(final) == 8 and all(final[key] == at for key, at in kept.items())


def test_a_reader_that_closes_early_ends_the_output_quietly(tmp_path):
    """`gflbench methods | head -0`: the reader is gone before the first line; no error message."""
    read, write = os.pipe()
    os.close(read)
    proc = subprocess.Popen([sys.executable, "-c", CODE, "methods"], cwd=ROOT, stdout=write, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    os.close(write)
    _, err = proc.communicate(timeout=300)
    assert err.strip() == "" and proc.returncode != 0


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_a_stdout_without_utf8_gets_ascii_spellings(tmp_path, encoding):
    """PYTHONIOENCODING=ascii or latin-1: tables print whole, with +- and ASCII borders where needed."""
    env = {**os.environ, "PYTHONIOENCODING": encoding, "GFLBENCH_DATA": str(tmp_path / "data")}
    store = str(tmp_path / "runs.sqlite")
    commands = [["run", "-m", "fedavg", "-d", "tiny", "--clients", "5", "--seeds", "2", "--rounds", "3", "--device", "cpu",
                 "--store", store], ["table", "-d", "tiny", "--rounds", "3", "--seeds", "2", "--store", store], ["methods"]]  # fmt: skip
    for args in commands:
        result = subprocess.run([sys.executable, "-c", CODE, *args], cwd=ROOT, env=env, capture_output=True,
                                timeout=300)  # fmt: skip
        text = result.stdout.decode(encoding)
        assert result.returncode == 0 and result.stderr == b"", result.stderr.decode(encoding, "replace")
        assert "fedavg" in text.lower()
        if encoding == "ascii" and args[0] in ("run", "table"):
            assert "+-" in text  # mean +- std, whole
    assert "±" in subprocess.run([sys.executable, "-c", CODE, *commands[1]], cwd=ROOT, env={**env, "PYTHONIOENCODING": "utf-8"},
                                 capture_output=True, text=True, timeout=300).stdout  # fmt: skip


def test_a_dry_run_refuses_negative_workers_as_the_real_sweep_does(tmp_path):
    from typer.testing import CliRunner

    from gflbench.commands.app import app

    result = CliRunner().invoke(app, ["sweep", "--dry-run", "-m", "fedavg", "-d", "tiny", "--clients", "5",
                                      "--workers", "-3", "--store", str(tmp_path / "none.sqlite")])  # fmt: skip
    assert result.exit_code == 2 and "--workers" in result.stderr and not (tmp_path / "none.sqlite").exists()
