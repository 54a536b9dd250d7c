"""The run store: one SQLite file, one row per finished run, keyed by the run key.

Why SQLite: it is embedded (no server), every insert is an atomic, durable transaction (a crash or
Ctrl-C leaves either the whole record or nothing), the primary key makes a duplicate impossible, and
pandas reads it for the tables. The full record (curves, config, provenance) is kept as JSON next to
the columns that tables filter on.
"""

from __future__ import annotations

import gzip
import json
import os
import sqlite3
import zlib
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from gfl_bench.errors import UserError

SCHEMA_VERSION = 2  # PRAGMA user_version; 2: the protocol column. A newer store is refused, never rewritten.
RESULTS_ENV = "GFLBENCH_RESULTS"
DEFAULT_STORE = Path("results") / "runs.sqlite"

_COLUMNS = (
    "run_key", "config_key", "method", "protocol", "dataset", "scheme", "clients", "data_seed", "seed",
    "metric", "status", "best_round", "val", "test", "val_weighted", "test_weighted",
    "val_client_best", "test_client_best", "seconds_per_round", "finished_at",
)  # fmt: skip

# Columns added after the first stores were written: opened stores gain them (NULL for older runs).
_ADDED_COLUMNS = {"val_client_best": "REAL", "test_client_best": "REAL", "protocol": "TEXT", "checksum": "INTEGER"}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_key TEXT PRIMARY KEY,
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
    checksum INTEGER
);
CREATE INDEX IF NOT EXISTS runs_cell ON runs (method, dataset, scheme, clients, config_key);
"""


class RunStore:
    """Finished runs on disk. Reads never block a writer; a write is all or nothing."""

    def __init__(self, path: Path) -> None:
        """Open (or create) the store; a damaged or newer store is refused before anything is written to it."""
        self.path = Path(path)
        existed = self.path.exists() and self.path.stat().st_size > 0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=60)
            if existed:
                self._check()
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            self._add_missing_columns()
            if self._db.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
                self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except UserError:
            self._db.close()
            raise
        except (OSError, sqlite3.DatabaseError) as error:
            raise UserError(f"cannot open the run store {self.path}: {error}") from None

    def _check(self) -> None:
        """Refuse a store that SQLite finds damaged, or that a newer gflbench wrote."""
        damaged = (f"the run store {self.path} is damaged ({{}}); nothing was written to it: restore it from a "
                   "backup, or move it away to start a new one (`sqlite3 FILE .recover` may save its runs)")  # fmt: skip
        try:
            verdict = [row[0] for row in self._db.execute("PRAGMA quick_check").fetchall()]
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as error:
            raise UserError(damaged.format(error)) from None
        if verdict != ["ok"]:
            raise UserError(damaged.format("quick_check: " + "; ".join(" ".join(v.split()) for v in verdict[:3])))
        bad = self._rows_failing_checksum()
        if bad:
            raise UserError(damaged.format(f"{bad} runs no longer match their checksum"))
        if version > SCHEMA_VERSION:
            raise UserError(f"the run store {self.path} was written by a newer gflbench (schema {version}, this one "
                            f"reads {SCHEMA_VERSION}); upgrade gflbench to use it")  # fmt: skip

    def _add_missing_columns(self) -> None:
        """Bring a store written by an older gflbench up to the current columns, in one transaction."""
        present = {row[1] for row in self._db.execute("PRAGMA table_info(runs)")}
        with self._db:
            for name, kind in _ADDED_COLUMNS.items():
                if name not in present:
                    self._db.execute(f"ALTER TABLE runs ADD COLUMN {name} {kind}")

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
        """run_key -> "ok" or "failed", for every stored run."""
        return dict(self._db.execute("SELECT run_key, status FROM runs").fetchall())

    def _rows_failing_checksum(self) -> int:
        """Rows whose content changed since they were written (SQLite's checks see structure, not content)."""
        present = {row[1] for row in self._db.execute("PRAGMA table_info(runs)")}
        if "checksum" not in present:
            return 0  # a store from before checksums: nothing to compare against
        names = ", ".join((*_COLUMNS, "record"))
        rows = self._db.execute(f"SELECT {names}, checksum FROM runs WHERE checksum IS NOT NULL")
        return sum(1 for *values, checksum in rows if _checksum(values) != checksum)

    def put(self, record: dict, replace: bool = False) -> None:
        """Store a finished run; an existing key is kept unless `replace` (then swapped atomically)."""
        with self._db:  # one transaction: committed whole, or rolled back
            self._insert(record, replace)

    def put_many(self, records: Iterable[dict]) -> int:
        """Store runs in one transaction (all of them or, on any error, none), keeping every key already
        stored; returns how many were new."""
        before = self._db.total_changes  # this connection's own inserts: a sweep writing meanwhile does not count
        with self._db:
            for record in records:
                self._insert(record, replace=False)
        return self._db.total_changes - before

    def _insert(self, record: dict, replace: bool) -> None:
        row = {
            **{c: record.get(c) for c in _COLUMNS},
            "status": record.get("status", "ok"),
            "seconds_per_round": _mean(record.get("seconds_per_round", [])),
            "record": json.dumps(record, sort_keys=True),
        }
        row["checksum"] = _checksum(list(row.values()))
        verb = "INSERT OR REPLACE" if replace else "INSERT OR IGNORE"
        names = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        self._db.execute(f"{verb} INTO runs ({names}) VALUES ({marks})", tuple(row.values()))

    def record(self, run_key: str) -> dict:
        row = self._db.execute("SELECT record FROM runs WHERE run_key = ?", (run_key,)).fetchone()
        if row is None:
            raise KeyError(run_key)
        return json.loads(row[0])

    def records(self, run_keys: Iterable[str] | None = None) -> list[dict]:
        """Full records, all of them or those with the given keys."""
        if run_keys is None:
            rows = self._db.execute("SELECT record FROM runs ORDER BY finished_at").fetchall()
        else:
            keys = list(run_keys)
            rows = []
            for start in range(0, len(keys), 500):
                chunk = keys[start : start + 500]
                marks = ", ".join("?" for _ in chunk)
                rows += self._db.execute(f"SELECT record FROM runs WHERE run_key IN ({marks})", chunk).fetchall()
        return [json.loads(r[0]) for r in rows]

    def frame(self) -> pd.DataFrame:
        """The summary columns of every stored run, one row each, plus each record's peak memory (NaN
        where a record has none) read from the record itself, so that no stored row changes."""
        peak = "json_extract(record, '$.peak_memory_bytes') AS peak_memory_bytes"
        return pd.read_sql_query(f"SELECT {', '.join(_COLUMNS)}, {peak} FROM runs", self._db)


# What a record must hold to be stored: the key, the cell it belongs to, and when it finished.
REQUIRED_FIELDS = ("run_key", "config_key", "method", "dataset", "scheme", "clients", "data_seed", "seed", "metric", "finished_at")


def write_records(path: Path, records: Iterable[dict]) -> int:
    """Write records as JSON Lines (gzip-compressed when `path` ends in .gz), sorted by run key so that
    two exports of the same runs are the same file; written beside `path` and renamed over it, so an
    interrupted export never leaves a half-written file under the name. Returns the count."""
    path = Path(path)
    rows = sorted(records, key=lambda r: r["run_key"])
    partial = path.with_name(path.name + ".partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(partial, "wb") as raw:
            # no name and mtime 0 in the gzip header, so the same runs give the same bytes
            out = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) if path.suffix == ".gz" else raw
            with out:
                for record in rows:
                    out.write((json.dumps(record, sort_keys=True) + "\n").encode())
        os.replace(partial, path)
    except OSError as error:
        partial.unlink(missing_ok=True)
        raise UserError(f"cannot write {path}: {error}") from None
    return len(rows)


def read_records(path: Path) -> list[dict]:
    """Every record of a `write_records` file, checked before any is stored: a file that is not JSON
    Lines, or a line that is not a run record, is a UserError naming the line."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    records = []
    try:
        with opener(path, "rt", encoding="utf-8") as file:
            for number, line in enumerate(file, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise UserError(f"{path}, line {number}: not JSON ({error.msg})") from None
                missing = [f for f in REQUIRED_FIELDS if not isinstance(record, dict) or record.get(f) is None]
                if missing:
                    raise UserError(f"{path}, line {number}: not a run record (no {', '.join(missing)})")
                records.append(record)
    except (OSError, EOFError, UnicodeDecodeError) as error:
        raise UserError(f"cannot read {path}: {error}") from None
    return records


def _checksum(values: list) -> int:
    """CRC-32 of a row's summary columns and record, in column order: cheap enough to verify every open."""
    return zlib.crc32(json.dumps(values, separators=(",", ":")).encode())


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
