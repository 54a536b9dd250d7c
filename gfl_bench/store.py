"""The run store: one SQLite file, one row per finished run, keyed by the run key.

Why SQLite: it is embedded (no server), every insert is an atomic, durable transaction (a crash or
Ctrl-C leaves either the whole record or nothing), the primary key makes a duplicate impossible, and
pandas reads it for the tables. The full record (curves, config, provenance) is kept as JSON next to
the columns that tables filter on.

What it promises beyond SQLite's own (docs/architecture.md, "The promise"): it changes no file that is
not a gflbench store; a run that cannot be written (the store locked past the wait, read-only, full)
goes to a spool file `gflbench import` takes, never lost; every record is strict JSON (no NaN or
Infinity tokens, which SQLite's JSON functions reject); and an imported record is checked against
itself (its keys, its values against its curves) and against the other imported records.
"""

from __future__ import annotations

import contextlib
import glob
import gzip
import json
import math
import os
import sqlite3
import stat
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from gfl_bench.errors import UserError
from gfl_bench.execution import execution_key, execution_rank

if TYPE_CHECKING:  # pandas (1.5 s to import) is loaded by `frame`, the one reader that needs it, not by `--help`
    import pandas as pd

# PRAGMA user_version; 2: the protocol column; 3: runs keyed by (run key, execution key) (`_migrate_to_executions`).
# A newer store is refused, never rewritten.
SCHEMA_VERSION = 3
RESULTS_ENV = "GFLBENCH_RESULTS"
DEFAULT_STORE = Path("results") / "runs.sqlite"
LOCK_WAIT_ENV = "GFLBENCH_LOCK_WAIT"
DEFAULT_LOCK_WAIT = 300.0  # seconds a write waits for another process's lock before it gives up (then spools)
_ATTEMPT_SECONDS = 5.0  # SQLite's own busy handler per attempt: two gflbench writers never wait longer than this

_COLUMNS = (
    "run_key", "execution_key", "config_key", "method", "protocol", "dataset", "scheme", "clients", "data_seed", "seed",
    "metric", "status", "best_round", "val", "test", "val_weighted", "test_weighted",
    "val_client_best", "test_client_best", "seconds_per_round", "finished_at",
)  # fmt: skip

# Columns added after the first stores were written: opened stores gain them (NULL for older runs).
_ADDED_COLUMNS = {"val_client_best": "REAL", "test_client_best": "REAL", "protocol": "TEXT", "checksum": "INTEGER"}

# A run is kept under its run key and its execution key (gfl_bench/execution.py): the same experiment
# computed per client and batched, or on CPU and GPU, is two records, both kept.
_TABLE = """
CREATE TABLE IF NOT EXISTS {name} (
    run_key TEXT NOT NULL,
    execution_key TEXT NOT NULL,
    config_key TEXT NOT NULL,
    method TEXT NOT NULL,
    protocol TEXT,
    dataset TEXT NOT NULL,
    scheme TEXT NOT NULL,
    clients INTEGER NOT NULL,
    data_seed INTEGER NOT NULL,
    seed INTEGER NOT NULL,
    metric TEXT NOT NULL,
    status TEXT NOT NULL,
    best_round INTEGER,
    val REAL,
    test REAL,
    val_weighted REAL,
    test_weighted REAL,
    val_client_best REAL,
    test_client_best REAL,
    seconds_per_round REAL,
    finished_at REAL NOT NULL,
    record TEXT NOT NULL,
    checksum INTEGER,
    PRIMARY KEY (run_key, execution_key)
);
"""
_INDEX = "CREATE INDEX IF NOT EXISTS runs_cell ON runs (method, dataset, scheme, clients, config_key);"
_SCHEMA = _TABLE.format(name="runs") + _INDEX


# The columns a gflbench store's `runs` table had from the first version on; any other column must be one
# a later version added (`_ADDED_COLUMNS`). A file whose schema is anything else is another program's.
# `execution_key` came with schema 3, which rebuilds the table around it (`_migrate_to_executions`).
_MIGRATED_COLUMNS = frozenset({"execution_key"})
_FIRST_COLUMNS = frozenset(c for c in (*_COLUMNS, "record") if c not in _ADDED_COLUMNS and c not in _MIGRATED_COLUMNS)
_OUR_SCHEMA = {("table", "runs"), ("index", "runs_cell")}

T = TypeVar("T")
Notify = Callable[[str], None]


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def lock_wait() -> float:
    """Seconds a write waits for another process's lock (GFLBENCH_LOCK_WAIT, default 300)."""
    text = os.environ.get(LOCK_WAIT_ENV)
    if text is None:
        return DEFAULT_LOCK_WAIT
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise UserError(f"{LOCK_WAIT_ENV} must be a number of seconds (0 or more), got {text!r}")
    return seconds


class RunStore:
    """Finished runs on disk. Reads never block a writer; a write is all or nothing."""

    def __init__(self, path: Path, notify: Notify = _to_stderr) -> None:
        """Open (or create) the store. A damaged store, one a newer gflbench wrote, or a file that is not a
        gflbench store is refused before anything is written to it. `notify` hears about waits for a lock
        and about runs spooled because the store could not take them."""
        self.path = Path(path)
        self._notify = notify
        self._wait = lock_wait()
        self.spool: Path | None = None  # where runs the store could not take were written (`put`)
        self._spooled: list[dict] = []
        existed = self.path.exists() and self.path.stat().st_size > 0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=_ATTEMPT_SECONDS)
            if existed:
                self._check()
            self._retrying(self._set_up, patient=True)
        except UserError:
            self._db.close()
            raise
        except (OSError, sqlite3.DatabaseError) as error:
            raise UserError(f"cannot open the run store {self.path}: {error}") from None

    def _set_up(self) -> None:
        """WAL (readers never block the writer), durable commits, and the current schema."""
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        self._add_missing_columns()
        self._migrate_to_executions()
        if self._db.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _check(self) -> None:
        """Refuse a store that SQLite finds damaged, that a newer gflbench wrote, or that is another program's."""
        damaged = (f"the run store {self.path} is damaged ({{}}); nothing was written to it: restore it from a "
                   "backup, or move it away to start a new one (`sqlite3 FILE .recover` may save its runs)")  # fmt: skip
        try:
            verdict = [row[0] for row in self._db.execute("PRAGMA quick_check").fetchall()]
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            entries = "SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"  # not SQLite's own
            schema = set(self._db.execute(entries).fetchall())
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(runs)")}
        except sqlite3.DatabaseError as error:
            raise UserError(damaged.format(error)) from None
        if verdict != ["ok"]:
            raise UserError(damaged.format("quick_check: " + "; ".join(" ".join(v.split()) for v in verdict[:3])))
        if version > SCHEMA_VERSION and "run_key" in columns:
            raise UserError(f"the run store {self.path} was written by a newer gflbench (schema {version}, this one "
                            f"reads {SCHEMA_VERSION}); upgrade gflbench to use it")  # fmt: skip
        ours = (not schema and version == 0) or (
            schema <= _OUR_SCHEMA
            and _FIRST_COLUMNS <= columns <= _FIRST_COLUMNS | set(_ADDED_COLUMNS) | _MIGRATED_COLUMNS
        )
        if not ours:
            held = ", ".join(f"{kind} {name}" for kind, name in sorted(schema)) or f"no tables, user_version {version}"
            raise UserError(f"{self.path} is not a gflbench run store (it holds {held}); nothing was changed in it: "
                            "pass another --store")  # fmt: skip
        bad = self._rows_failing_checksum()
        if bad:
            raise UserError(damaged.format(f"{bad} runs no longer match their checksum"))

    def _add_missing_columns(self) -> None:
        """Bring a store written by an older gflbench up to the current columns, in one transaction."""
        present = {row[1] for row in self._db.execute("PRAGMA table_info(runs)")}
        with self._db:
            for name, kind in _ADDED_COLUMNS.items():
                if name not in present:
                    self._db.execute(f"ALTER TABLE runs ADD COLUMN {name} {kind}")

    def _migrate_to_executions(self) -> None:
        """Schema 3: key every stored run by (run key, execution key), in one transaction. Run keys, records and
        values stay as they were; each row gains its record's execution key (`execution.Execution.of_record`:
        a record without the fields, per-client/dense/alone/cpu) and, where it had one, a checksum over the new
        columns (the old checksums were verified when the store was opened, `_check`). SQLite cannot change a
        primary key in place, so the table is copied into the new shape and renamed over the old one."""
        self._db.execute("BEGIN IMMEDIATE")  # another process migrating the same store waits here, then finds it done
        try:
            present = [row[1] for row in self._db.execute("PRAGMA table_info(runs)")]
            if "execution_key" in present:
                self._db.execute("ROLLBACK")
                return
            old = [c for c in (*_COLUMNS, "record") if c not in _MIGRATED_COLUMNS]
            rows = self._db.execute(f"SELECT {', '.join(old)}, checksum FROM runs").fetchall()
            self._db.execute("DROP INDEX IF EXISTS runs_cell")
            self._db.execute(_TABLE.format(name="runs_by_execution"))
            for *values, checksum in rows:
                stored = dict(zip(old, values, strict=True))
                row = {c: stored.get(c) for c in (*_COLUMNS, "record")}
                row["execution_key"] = execution_key(json.loads(stored["record"]))  # NaN tokens of old records parse
                row["checksum"] = None if checksum is None else _checksum(list(row.values()))
                names, marks = ", ".join(row), ", ".join("?" for _ in row)
                self._db.execute(f"INSERT INTO runs_by_execution ({names}) VALUES ({marks})", tuple(row.values()))
            self._db.execute("DROP TABLE runs")
            self._db.execute("ALTER TABLE runs_by_execution RENAME TO runs")
            self._db.execute(_INDEX)
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def _retrying(self, write: Callable[[], T], patient: bool) -> T:
        """Run `write`; while another process holds the store's lock (an open sqlite3 shell, a DB browser),
        try again with exponential back-off for up to GFLBENCH_LOCK_WAIT seconds (`patient`) and say so
        once, or give up after one attempt (not `patient`). Other errors, and the last lock, are raised."""
        deadline = None  # set at the first lock: the wait counts from there
        delay = 0.5
        while True:
            try:
                return write()
            except sqlite3.OperationalError as error:
                if not _locked(error) or not patient or self._wait <= 0:
                    raise
                if deadline is None:
                    deadline = time.monotonic() + self._wait
                    self._notify(f"the run store {self.path} is locked by another process (an open sqlite3 shell or "
                                 f"database browser?); waiting up to {self._wait:.0f} s ({LOCK_WAIT_ENV})")  # fmt: skip
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                time.sleep(min(delay, left))
                delay = min(2 * delay, 30.0)

    def ensure_writable(self) -> None:
        """Prove, before any run starts, that this store can take a write: a read-only file, folder or
        mount fails here and not after the runs are computed; another process's lock is waited for."""

        def probe() -> None:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                version = self._db.execute("PRAGMA user_version").fetchone()[0]
                self._db.execute(f"PRAGMA user_version = {version}")  # a write, rolled back below
            finally:
                self._db.execute("ROLLBACK")

        try:
            self._retrying(probe, patient=True)
        except sqlite3.Error as error:
            if _locked(error):
                raise UserError(f"the run store {self.path} is still locked by another process after "
                                f"{self._wait:.0f} s; nothing was run: close the other program (or raise "
                                f"{LOCK_WAIT_ENV}) and rerun") from None  # fmt: skip
            reason = "read-only" if "readonly" in str(error) else "not writable"
            raise UserError(f"the run store {self.path} is {reason} ({error}); nothing was run: make it writable "
                            "or pass another --store") from None  # fmt: skip

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __contains__(self, run_key: str) -> bool:
        return self._db.execute("SELECT 1 FROM runs WHERE run_key = ?", (run_key,)).fetchone() is not None

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]

    def statuses(self) -> dict[str, str]:
        """run_key -> "ok" or "failed", for every stored run: the status of the execution tables read (`_first`)."""
        rows = self._db.execute("SELECT run_key, execution_key, status FROM runs").fetchall()
        return {key: status for key, _, status in _first(rows)}

    def executions(self, run_key: str) -> list[str]:
        """The execution keys this run is stored under, the one tables read first."""
        rows = self._db.execute("SELECT execution_key FROM runs WHERE run_key = ?", (run_key,)).fetchall()
        return sorted((row[0] for row in rows), key=execution_rank)

    def _rows_failing_checksum(self) -> int:
        """Rows whose content changed since they were written (SQLite's checks see structure, not content)."""
        present = {row[1] for row in self._db.execute("PRAGMA table_info(runs)")}
        if "checksum" not in present:
            return 0  # a store from before checksums: nothing to compare against
        names = ", ".join(c for c in (*_COLUMNS, "record") if c in present)  # a store before schema 3 lacks some
        rows = self._db.execute(f"SELECT {names}, checksum FROM runs WHERE checksum IS NOT NULL")
        return sum(1 for *values, checksum in rows if _checksum(values) != checksum)

    def put(self, record: dict, replace: bool = False) -> None:
        """Store a finished run; an existing key is kept unless `replace` (then swapped atomically).

        A computed run is never thrown away: if the store cannot take it (still locked after the wait,
        read-only, full), the record goes to this store's spool file (`spool`, named to `notify`), which
        `gflbench import` adds later. Once a run was spooled, later ones try the store once, without waiting.
        """
        row = _row(record)
        try:
            self._retrying(lambda: self._insert_rows([row], replace), patient=not self._spooled)
        except sqlite3.Error as error:
            self._spool_record(record, str(error))
        except KeyboardInterrupt:  # Ctrl-C while waiting for a lock: the run is kept all the same
            self._spool_record(record, "interrupted while waiting for its lock")
            raise

    def put_many(self, records: Iterable[dict]) -> int:
        """Store runs in one transaction (all of them or, on any error, none), keeping every key already
        stored; returns how many were new. A store that cannot take them is a UserError."""
        rows = [_row(record) for record in records]
        try:
            return self._retrying(lambda: self._insert_rows(rows, replace=False), patient=True)
        except sqlite3.Error as error:
            raise UserError(f"cannot write the run store {self.path} ({error}); nothing was imported") from None

    def _insert_rows(self, rows: list[dict], replace: bool) -> int:
        """Insert in one transaction; the count of new rows (this connection's own: a sweep writing meanwhile
        does not count)."""
        before = self._db.total_changes
        verb = "INSERT OR REPLACE" if replace else "INSERT OR IGNORE"
        with self._db:  # one transaction: committed whole, or rolled back
            for row in rows:
                names = ", ".join(row)
                marks = ", ".join("?" for _ in row)
                self._db.execute(f"{verb} INTO runs ({names}) VALUES ({marks})", tuple(row.values()))
        return self._db.total_changes - before

    def _spool_record(self, record: dict, error: str) -> None:
        """Keep a run the store could not take: every spooled run of this process in one file, rewritten
        whole each time (never half a file), beside the store, else in the working folder, else in /tmp."""
        self._spooled.append(finite(record))
        stamp = time.strftime("%Y%m%d-%H%M%S")
        name = f"{self.path.name}.spool-{stamp}-{os.getpid()}.jsonl.gz"
        folders = (self.path.parent, Path.cwd(), Path(tempfile.gettempdir()))
        places = [self.spool] if self.spool else [folder / name for folder in folders]
        for place in places:
            try:
                write_records(place, self._spooled)
            except UserError:
                continue
            self.spool = place
            self._notify(f"could not write the run store {self.path} ({error}); the finished run is kept in "
                         f"{place} ({len(self._spooled)} there): `gflbench import {place} --store {self.path}` "
                         "adds it")  # fmt: skip
            return
        raise UserError(f"could not write the run store {self.path} ({error}), nor a spool file in "
                        f"{', '.join(str(p.parent) for p in places)}")  # fmt: skip

    @property
    def spooled(self) -> int:
        """How many runs went to the spool file instead of the store."""
        return len(self._spooled)

    def record(self, run_key: str, execution: str | None = None) -> dict:
        """A run's record: under `execution`, or the one tables read (`_first`)."""
        rows = self._db.execute("SELECT run_key, execution_key, record FROM runs WHERE run_key = ?", (run_key,))
        chosen = [text for _, key, text in _first(rows.fetchall(), keep_all=execution is not None)
                  if execution is None or key == execution]  # fmt: skip
        if not chosen:
            raise KeyError(run_key if execution is None else (run_key, execution))
        return json.loads(chosen[0])

    def records(self, run_keys: Iterable[str] | None = None, every_execution: bool = False) -> list[dict]:
        """Full records: every stored one (every execution of every run: what `export` writes), or those
        with the given run keys, one per key (the execution tables read) unless `every_execution`."""
        if run_keys is None:
            rows = self._db.execute("SELECT record FROM runs ORDER BY finished_at, execution_key").fetchall()
            return [json.loads(r[0]) for r in rows]
        keys = list(run_keys)
        found = []
        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            marks = ", ".join("?" for _ in chunk)
            query = f"SELECT run_key, execution_key, record FROM runs WHERE run_key IN ({marks}) ORDER BY finished_at"
            found += self._db.execute(query, chunk).fetchall()
        return [json.loads(text) for _, _, text in _first(found, keep_all=every_execution)]

    def frame(self, every_execution: bool = False) -> pd.DataFrame:
        """The summary columns of every stored run, one row each (the execution tables read, `_first`; every
        execution of it with `every_execution`), plus each record's peak memory (NaN where a record has none)
        read from the record itself, so that no stored row changes.

        `non_finite` marks a record written before records were strict JSON, with NaN tokens in it (a
        client without the nodes a metric needs): SQLite's JSON functions reject such text, so it is
        read without them; its summary columns are as they were stored."""
        import pandas as pd

        strict = "json_valid(record)"
        peak = f"CASE WHEN {strict} THEN json_extract(record, '$.peak_memory_bytes') END AS peak_memory_bytes"
        query = f"SELECT {', '.join(_COLUMNS)}, {peak}, NOT {strict} AS non_finite FROM runs"
        frame = pd.read_sql_query(query, self._db)
        frame["non_finite"] = frame["non_finite"].astype(bool)
        if every_execution or frame.empty:
            return frame
        rank = frame["execution_key"].map(execution_rank)
        first = frame.assign(_rank=rank).sort_values(["run_key", "_rank"], kind="stable")
        return first.drop_duplicates("run_key").drop(columns="_rank").sort_index()


def _first(rows: Iterable[tuple], keep_all: bool = False) -> list[tuple]:
    """Of rows (run_key, execution_key, ...), the one per run key that tables read: the execution of the
    lowest `execution.execution_rank` (per-client before batched, dense before sparse, alone before stacked,
    CPU first), so that storing another execution of a run never moves a table's cell. Run keys in the order
    they first appear; with `keep_all`, every row, each run key's ranked."""
    by_key: dict[str, list[tuple]] = {}
    for row in rows:
        by_key.setdefault(row[0], []).append(row)
    ranked = [sorted(group, key=lambda row: execution_rank(row[1])) for group in by_key.values()]
    return [row for group in ranked for row in group] if keep_all else [group[0] for group in ranked]


def _locked(error: sqlite3.Error) -> bool:
    """Whether SQLite gave up waiting for another connection's lock (SQLITE_BUSY or SQLITE_LOCKED)."""
    return str(error).startswith(("database is locked", "database table is locked"))


def finite(value: Any) -> Any:
    """`value` with every non-finite float (NaN, ±inf) replaced by None, inside dicts and lists too.

    JSON has no such numbers: Python writes the tokens NaN and Infinity, which SQLite's JSON functions
    (and most JSON readers) reject, so one such record made every query of the store fail. null says
    "undefined" in any reader; a record's `excluded_clients` says why a client's value is undefined.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


def _json(record: dict) -> str:
    """A record as strict JSON (finite numbers or null), keys sorted."""
    return json.dumps(finite(record), sort_keys=True, allow_nan=False)


def _row(record: dict) -> dict:
    """The store row of a record: its summary columns, the record as strict JSON, and their checksum."""
    row = {
        **{c: finite(record.get(c)) for c in _COLUMNS},
        "execution_key": execution_key(record),
        "status": record.get("status", "ok"),
        "seconds_per_round": round_seconds(record),
        "record": _json(record),
    }
    row["checksum"] = _checksum(list(row.values()))
    return row


# What a record must hold to be stored by `import`: the key, the configuration it was computed from, the
# cell it belongs to, its outcome, and when it finished; a finished run also its values and curves.
REQUIRED_FIELDS = ("run_key", "config_key", "config", "method", "dataset", "scheme", "clients", "data_seed", "seed",
                   "metric", "status", "finished_at")  # fmt: skip
_OK_FIELDS = ("best_round", "val", "test", "val_weighted", "test_weighted", "curves", "client_curves")
# What a run measured: two records under one key that differ here are two different results of one
# experiment (a conflict), while timings and provenance (host, versions, commit) may differ between machines.
RESULT_FIELDS = ("status", "metric", "best_round", "val", "test", "val_weighted", "test_weighted", "val_client_best",
                 "test_client_best", "curves", "client_curves", "excluded_clients", "diagnostics", "bytes_up",
                 "bytes_down", "partition_hash", "data_fingerprint", "error")  # fmt: skip
# How far a client mean recomputed from a record's client curves may be from its stored value: the run
# averages float32 values on its device, the check in float64.
_MEAN_TOLERANCE = 1e-5


def _check_target(path: Path) -> None:
    """Refuse an export or spool target that is not a regular file (or a new name in a folder): renaming
    over it would replace a device node, FIFO or symlink with a file (as root, /dev/full became one)."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    except NotADirectoryError:
        parent = next(p for p in path.parents if p.exists())
        raise UserError(f"cannot write {path}: {parent} is a file, not a folder") from None
    except OSError as error:
        raise UserError(f"cannot write {path}: {error}") from None
    if not stat.S_ISREG(mode):
        kinds = {stat.S_ISLNK: "symbolic link", stat.S_ISDIR: "folder", stat.S_ISFIFO: "FIFO", stat.S_ISCHR: "device",
                 stat.S_ISBLK: "device", stat.S_ISSOCK: "socket"}  # fmt: skip
        kind = next((name for test, name in kinds.items() if test(mode)), "special file")
        raise UserError(f"refusing to write {path}: it is a {kind}, not a regular file; give a file name")


def write_records(path: Path, records: Iterable[dict]) -> int:
    """Write records as JSON Lines (gzip-compressed when `path` ends in .gz), sorted by run key so that
    two exports of the same runs are the same file; written beside `path` and renamed over it, so an
    interrupted export never leaves a half-written file under the name, and the next export to the name
    removes what a killed one left beside it. Only a regular file (or a new name) is written: a symlink,
    device, FIFO or folder there is refused. Returns the count."""
    from gfl_bench.datasets import partial_path, remove_stale_partials

    path = Path(path)
    _check_target(path)
    rows = sorted(records, key=lambda r: r["run_key"])
    partial = partial_path(path, hidden=True)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # what an export to this name killed midway left (`.<name>.<host>-<pid>.partial`); nothing else there
        remove_stale_partials(path.parent, f".{glob.escape(path.name)}.*.partial")
        with open(partial, "xb") as raw:  # a new file of our own: never through a link someone placed there
            # no name and mtime 0 in the gzip header, so the same runs give the same bytes
            out = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) if path.suffix == ".gz" else raw
            with out:
                for record in rows:
                    out.write((_json(record) + "\n").encode())
        os.replace(partial, path)
    except OSError as error:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise UserError(f"cannot write {path}: {error}") from None
    return len(rows)


@dataclass(frozen=True)
class Imported:
    """A record read from a `write_records` file, with where it was read (for messages)."""

    record: dict
    where: str  # "FILE, line N"


def read_records(path: Path) -> list[Imported]:
    """Every record of a `write_records` file, each checked before any is stored (`check_record`): a
    file that is not JSON Lines, a non-finite number, or a line that is not a consistent run record is
    a UserError naming the file and line."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    records = []
    try:
        with opener(path, "rt", encoding="utf-8") as file:
            for number, line in enumerate(file, 1):
                if not line.strip():
                    continue
                where = f"{path}, line {number}"
                try:
                    record = json.loads(line, parse_constant=_refuse_constant)
                except json.JSONDecodeError as error:
                    raise UserError(f"{where}: not JSON ({error.msg})") from None
                except ValueError as error:
                    raise UserError(f"{where}: {error}") from None
                problem = check_record(record)
                if problem:
                    raise UserError(f"{where}: {problem}; nothing was imported")
                records.append(Imported(record, where))
    except (OSError, EOFError, UnicodeDecodeError) as error:
        raise UserError(f"cannot read {path}: {error}") from None
    return records


def _refuse_constant(token: str) -> None:
    """json.loads' hook for NaN, Infinity and -Infinity, which Python reads but JSON does not have."""
    raise ValueError(f"non-finite number {token} (JSON has no NaN or Infinity; gflbench writes null); "
                     "nothing was imported")  # fmt: skip


def check_record(record: object) -> str | None:
    """What is wrong with a record about to be imported, or None: required fields missing, keys that do
    not follow from its configuration and seed, or values that are not its curves' at its best round."""
    from gfl_bench.records import best_round, config_key_of, per_client_best, run_key_of

    if not isinstance(record, dict):
        return "not a run record (not a JSON object)"
    missing = [f for f in REQUIRED_FIELDS if record.get(f) is None]
    if missing:
        return f"not a run record (no {', '.join(missing)})"
    config = record["config"]
    if not isinstance(config, dict) or record["status"] not in ("ok", "failed"):
        return "not a run record (its config is not an object, or its status is neither ok nor failed)"
    for name in ("method", "data_seed", "protocol"):
        if name in config and name in record and config[name] != record[name]:
            return f"its {name} {record[name]!r} is not its config's {config[name]!r}"
    if config_key_of(config) != record["config_key"]:
        return f"its config key {record['config_key']} is not the key of its config ({config_key_of(config)})"
    key = run_key_of(
        record["config_key"], record["dataset"], record["scheme"], record["clients"], record["seed"],
        record.get("participation", 1.0),  # records made before partial participation ran every client
    )  # fmt: skip
    if key != record["run_key"]:
        where = f"{record['dataset']} {record['scheme']}-{record['clients']} and seed {record['seed']}"
        return f"its run key {record['run_key']} does not follow from its config, {where} (that run's key is {key})"
    if record["status"] == "failed":
        return None if record.get("error") else "a failed run without its error"
    missing = [f for f in _OK_FIELDS if record.get(f) is None]
    if missing:
        return f"a finished run without {', '.join(missing)}"
    curves, clients = record["curves"], record["client_curves"]
    try:
        best = best_round([math.nan if v is None else v for v in curves["val"]])
        if best != record["best_round"]:
            return f"its best round {record['best_round']} is not its validation curve's best round ({best})"
        for name in ("val", "test", "val_weighted", "test_weighted"):
            if curves[name][best] != record[name]:
                return (
                    f"its {name} {record[name]} is not its curve's value at its best round {best} "
                    f"({curves[name][best]})"
                )
        for name in ("val", "test"):
            defined = [v for v in clients[name][best] if v is not None]
            mean = sum(defined) / len(defined) if defined else None
            if mean is None or abs(mean - record[name]) > _MEAN_TOLERANCE:
                return f"its {name} {record[name]} is not the mean of its client curves at round {best} ({mean})"
        nan = [[math.nan if v is None else v for v in row] for row in clients["val"]]
        chosen = per_client_best(nan, [[math.nan if v is None else v for v in row] for row in clients["test"]])
        for name, value in zip(("val_client_best", "test_client_best"), finite(list(chosen)), strict=True):
            if record.get(name) is not None and record[name] != value:
                return f"its {name} {record[name]} is not what its client curves give ({value})"
    except (KeyError, IndexError, TypeError, ValueError) as error:
        return f"its curves are malformed ({type(error).__name__}: {error})"
    return None


def _differing_results(a: dict, b: dict) -> list[str]:
    """The results (`RESULT_FIELDS`) two records of one run key hold differently, by name; none: the same
    run. A field only one of them has is no disagreement: records written before it existed lack it
    (`excluded_clients`, `data_fingerprint`). A `data_fingerprint` alone may differ: the same run key
    computed on other processed data (another data folder, a changed PyG), which is not the same run."""
    return [name for name in RESULT_FIELDS
            if a.get(name) is not None and b.get(name) is not None and _json(a[name]) != _json(b[name])]  # fmt: skip


def _fields(names: list[str]) -> str:
    """The differing fields for a one-line message, saying what a differing `data_fingerprint` means."""
    return ", ".join(f"{n} (other processed data)" if n == "data_fingerprint" else n for n in names)


def identity(record: dict) -> tuple[str, str]:
    """What the store keeps a record under: its run key and its execution key (gfl_bench/execution.py)."""
    return record["run_key"], execution_key(record)


def distinct(imported: list[Imported]) -> list[dict]:
    """The records of `imported`, one per identity (the first read): what `import` stores."""
    chosen: dict[tuple[str, str], dict] = {}
    for item in imported:
        chosen.setdefault(identity(item.record), item.record)
    return list(chosen.values())


def disagreements(imported: list[Imported]) -> list[str]:
    """Runs (one execution of one run key) that two imported records hold with different results, each as
    "KEY EXECUTION (WHERE vs WHERE: FIELDS)"; records repeated with the same results are no conflict, and two
    executions of one run differ by right (their spread is the execution band)."""
    first: dict[tuple[str, str], Imported] = {}
    found = []
    for item in imported:
        seen = first.setdefault(identity(item.record), item)
        if differ := _differing_results(seen.record, item.record):
            key, execution = identity(item.record)
            found.append(f"{key} {execution} ({seen.where} vs {item.where}: {_fields(differ)})")
    return found


def differing_from_stored(store: RunStore, records: list[dict]) -> list[str]:
    """Records whose run the store holds, under the same execution, with other results, each as "KEY
    (method dataset scheme-clients seed S EXECUTION: FIELDS)": `import` keeps the stored run, and says which
    differ and in what."""
    incoming = {identity(record): record for record in records}
    found = []
    for r in store.records({key for key, _ in incoming}, every_execution=True):
        other = incoming.get(identity(r))
        if other is not None and (differ := _differing_results(r, other)):
            found.append(f"{r['run_key']} ({r['method']} {r['dataset']} {r['scheme']}-{r['clients']} seed {r['seed']} "
                         f"{execution_key(r)}: {_fields(differ)})")  # fmt: skip
    return found


def _checksum(values: list) -> int:
    """CRC-32 of a row's summary columns and record, in column order: cheap enough to verify every open."""
    return zlib.crc32(json.dumps(values, separators=(",", ":")).encode())


def round_seconds(record: dict) -> float | None:
    """The `seconds_per_round` column of a record: the median of its rounds after the first.

    Round 0 carries one-off work (CUDA and library start-up, FedSage+'s generator phase), so its time
    depends on the run's place in its worker; records that store it apart (`first_round_seconds`, from
    the commit that added it on) get the median of rounds 1.. (round 0 alone for a one-round run). A
    record without it, written before, keeps the column it was stored with: the mean of all its rounds.
    The record itself keeps every round's time either way.
    """
    import statistics

    values = record.get("seconds_per_round") or []
    if not values:
        return None
    if "first_round_seconds" not in record:
        return sum(values) / len(values)
    return statistics.median(values[1:] or values)
