"""The store's table: its columns, its checksum, and what opening a file does: a store that SQLite finds damaged,
that a newer gflbench wrote, or that is another program's file is refused; an older gflbench's store is brought
up to the current schema, each step in one transaction (schema 4 re-keys runs stored before a field of their
method existed: gfl_bench/experiments/upgrades.py)."""

from __future__ import annotations

import json
import sqlite3
import zlib
from pathlib import Path

from gflbench.core.execution import execution_key
from gflbench.errors import UserError
from gflbench.experiments.upgrades import FIELDS_ADDED, UPGRADE_SCHEMA, upgrade_record

# PRAGMA user_version; 2: the protocol column; 3: runs keyed by (run key, execution key) (`_migrate_to_executions`);
# 4: runs stored before a field of their method existed re-keyed with it (`_migrate_to_full_keys`).
# A newer store is refused, never rewritten.
SCHEMA_VERSION = UPGRADE_SCHEMA

_COLUMNS = (
    "run_key", "execution_key", "config_key", "method", "protocol", "dataset", "scheme", "clients", "data_seed", "seed",
    "metric", "status", "best_round", "val", "test", "val_weighted", "test_weighted",
    "val_client_best", "test_client_best", "seconds_per_round", "finished_at",
)  # fmt: skip

# Columns added after the first stores were written: opened stores gain them (NULL for older runs).
_ADDED_COLUMNS = {"val_client_best": "REAL", "test_client_best": "REAL", "protocol": "TEXT", "checksum": "INTEGER"}

# A run is kept under its run key and its execution key (gfl_bench/core/execution.py): the same experiment
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


def insert(db: sqlite3.Connection, row: dict, verb: str = "INSERT", table: str = "runs") -> None:
    """Write one row (column -> value) into `table`; `verb` may be INSERT OR IGNORE / OR REPLACE."""
    names, marks = ", ".join(row), ", ".join("?" for _ in row)
    db.execute(f"{verb} INTO {table} ({names}) VALUES ({marks})", tuple(row.values()))


def set_up(db: sqlite3.Connection) -> None:
    """WAL (readers never block the writer), durable commits, and the current schema."""
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.executescript(_SCHEMA)
    _add_missing_columns(db)
    _migrate_to_executions(db)
    _migrate_to_full_keys(db)


def check(db: sqlite3.Connection, path: Path) -> None:
    """Refuse a store that SQLite finds damaged, that a newer gflbench wrote, or that is another program's."""
    damaged = (f"the run store {path} is damaged ({{}}); nothing was written to it: restore it from a "
               "backup, or move it away to start a new one (`sqlite3 FILE .recover` may save its runs)")  # fmt: skip
    try:
        verdict = [row[0] for row in db.execute("PRAGMA quick_check").fetchall()]
        version = db.execute("PRAGMA user_version").fetchone()[0]
        entries = "SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"  # not SQLite's own
        schema = set(db.execute(entries).fetchall())
        columns = {row[1] for row in db.execute("PRAGMA table_info(runs)")}
    except sqlite3.DatabaseError as error:
        raise UserError(damaged.format(error)) from None
    if verdict != ["ok"]:
        raise UserError(damaged.format("quick_check: " + "; ".join(" ".join(v.split()) for v in verdict[:3])))
    if version > SCHEMA_VERSION and "run_key" in columns:
        raise UserError(f"the run store {path} was written by a newer gflbench (schema {version}, this one "
                        f"reads {SCHEMA_VERSION}); upgrade gflbench to use it")  # fmt: skip
    ours = (not schema and version == 0) or (
        schema <= _OUR_SCHEMA and _FIRST_COLUMNS <= columns <= _FIRST_COLUMNS | set(_ADDED_COLUMNS) | _MIGRATED_COLUMNS
    )
    if not ours:
        held = ", ".join(f"{kind} {name}" for kind, name in sorted(schema)) or f"no tables, user_version {version}"
        raise UserError(f"{path} is not a gflbench run store (it holds {held}); nothing was changed in it: "
                        "pass another --store")  # fmt: skip
    bad = _rows_failing_checksum(db)
    if bad:
        raise UserError(damaged.format(f"{bad} runs no longer match their checksum"))


def _add_missing_columns(db: sqlite3.Connection) -> None:
    """Bring a store written by an older gflbench up to the current columns, in one transaction."""
    present = {row[1] for row in db.execute("PRAGMA table_info(runs)")}
    with db:
        for name, kind in _ADDED_COLUMNS.items():
            if name not in present:
                db.execute(f"ALTER TABLE runs ADD COLUMN {name} {kind}")


def _migrate_to_executions(db: sqlite3.Connection) -> None:
    """Schema 3: key every stored run by (run key, execution key), in one transaction. Run keys, records and
    values stay as they were; each row gains its record's execution key (`execution.Execution.of_record`:
    a record without the fields, per-client/dense/alone/cpu) and, where it had one, a checksum over the new
    columns (the old checksums were verified when the store was opened, `check`). SQLite cannot change a
    primary key in place, so the table is copied into the new shape and renamed over the old one."""
    db.execute("BEGIN IMMEDIATE")  # another process migrating the same store waits here, then finds it done
    try:
        present = [row[1] for row in db.execute("PRAGMA table_info(runs)")]
        if "execution_key" in present:
            db.execute("ROLLBACK")
            return
        old = [c for c in (*_COLUMNS, "record") if c not in _MIGRATED_COLUMNS]
        rows = db.execute(f"SELECT {', '.join(old)}, checksum FROM runs").fetchall()
        db.execute("DROP INDEX IF EXISTS runs_cell")
        db.execute(_TABLE.format(name="runs_by_execution"))
        for *values, checksum in rows:
            stored = dict(zip(old, values, strict=True))
            row = {c: stored.get(c) for c in (*_COLUMNS, "record")}
            row["execution_key"] = execution_key(json.loads(stored["record"]))  # NaN tokens of old records parse
            row["checksum"] = None if checksum is None else _checksum(list(row.values()))
            insert(db, row, table="runs_by_execution")
        db.execute("DROP TABLE runs")
        db.execute("ALTER TABLE runs_by_execution RENAME TO runs")
        db.execute(_INDEX)
        db.execute("PRAGMA user_version = 3")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _migrate_to_full_keys(db: sqlite3.Connection) -> None:
    """Schema 4: every stored run of a method whose Params gained a field after it ran gets the field at the
    value it ran with, and the config and run keys that follow (`upgrades.upgrade_record`, which keeps the old
    keys in the record's `upgrades`), in one transaction; values, curves and execution keys stay as they were.
    Where the store already holds the upgraded run under the same execution (an import of an upgraded file),
    the row stored first is kept, as `put` keeps it. A new store has nothing to upgrade and is marked 4."""
    from gflbench.experiments.store.rows import _row  # rows reads this module's columns

    db.execute("BEGIN IMMEDIATE")  # another process migrating the same store waits here, then finds it done
    try:
        if db.execute("PRAGMA user_version").fetchone()[0] >= SCHEMA_VERSION:
            db.execute("ROLLBACK")
            return
        marks = ", ".join("?" for _ in FIELDS_ADDED)
        stored = db.execute(f"SELECT rowid, record FROM runs WHERE method IN ({marks})", tuple(FIELDS_ADDED))
        for rowid, text in stored.fetchall():
            record = json.loads(text)
            upgraded = upgrade_record(record)
            if upgraded["run_key"] == record["run_key"]:
                continue
            db.execute("DELETE FROM runs WHERE rowid = ?", (rowid,))
            insert(db, _row(upgraded), "INSERT OR IGNORE")
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _rows_failing_checksum(db: sqlite3.Connection) -> int:
    """Rows whose content changed since they were written (SQLite's checks see structure, not content)."""
    present = {row[1] for row in db.execute("PRAGMA table_info(runs)")}
    if "checksum" not in present:
        return 0  # a store from before checksums: nothing to compare against
    names = ", ".join(c for c in (*_COLUMNS, "record") if c in present)  # a store before schema 3 lacks some
    rows = db.execute(f"SELECT {names}, checksum FROM runs WHERE checksum IS NOT NULL")
    return sum(1 for *values, checksum in rows if _checksum(values) != checksum)


def _checksum(values: list) -> int:
    """CRC-32 of a row's summary columns and record, in column order: cheap enough to verify every open."""
    return zlib.crc32(json.dumps(values, separators=(",", ":")).encode())
