"""`RunStore`: the SQLite file of finished runs, one row per run and execution. Reads never block a writer;
a write is one transaction that waits, with back-off, for another process's lock, and a run the store cannot
take goes to a spool file rather than being lost."""

from __future__ import annotations

import json
import math
import os
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from gflbench.core.execution import execution_rank
from gflbench.errors import UserError
from gflbench.experiments.store.files import write_records
from gflbench.experiments.store.rows import _first, _row, finite
from gflbench.experiments.store.schema import _COLUMNS, check, insert, set_up

if TYPE_CHECKING:  # pandas (1.5 s to import) is loaded by `frame`, the one reader that needs it, not by `--help`
    import pandas as pd

RESULTS_ENV = "GFLBENCH_RESULTS"
DEFAULT_STORE = Path("results") / "runs.sqlite"
LOCK_WAIT_ENV = "GFLBENCH_LOCK_WAIT"
DEFAULT_LOCK_WAIT = 300.0  # seconds a write waits for another process's lock before it gives up (then spools)
_ATTEMPT_SECONDS = 5.0  # SQLite's own busy handler per attempt: two gflbench writers never wait longer than this

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
                check(self._db, self.path)
            self._retrying(lambda: set_up(self._db), patient=True)
        except UserError:
            self._db.close()
            raise
        except (OSError, sqlite3.DatabaseError) as error:
            raise UserError(f"cannot open the run store {self.path}: {error}") from None

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
                insert(self._db, row, verb)
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
        and global reading (`global_val`, `global_test`, `global_recorded`) read from the record itself, so
        that no stored row changes.

        `non_finite` marks a record written before records were strict JSON, with NaN tokens in it (a
        client without the nodes a metric needs): SQLite's JSON functions reject such text, so it is
        read without them; its summary columns are as they were stored."""
        import pandas as pd

        strict = "json_valid(record)"
        peak = f"CASE WHEN {strict} THEN json_extract(record, '$.peak_memory_bytes') END AS peak_memory_bytes"
        # The global model's reading (docs/protocol.md, "Evaluation modes"); `global_recorded`: the record has
        # the field, null included (a method without a global model), unlike a record written before it existed.
        reading = ", ".join(
            f"CASE WHEN {strict} THEN json_extract(record, '$.{c}') END AS {c}" for c in ("global_val", "global_test")
        )
        recorded = (
            f"CASE WHEN {strict} THEN json_type(record, '$.global_test') IS NOT NULL ELSE 0 END AS global_recorded"
        )
        query = f"SELECT {', '.join(_COLUMNS)}, {peak}, {reading}, {recorded}, NOT {strict} AS non_finite FROM runs"
        frame = pd.read_sql_query(query, self._db)
        frame["non_finite"] = frame["non_finite"].astype(bool)
        frame["global_recorded"] = frame["global_recorded"].astype(bool)
        if every_execution or frame.empty:
            return frame
        rank = frame["execution_key"].map(execution_rank)
        first = frame.assign(_rank=rank).sort_values(["run_key", "_rank"], kind="stable")
        return first.drop_duplicates("run_key").drop(columns="_rank").sort_index()


def _locked(error: sqlite3.Error) -> bool:
    """Whether SQLite gave up waiting for another connection's lock (SQLITE_BUSY or SQLITE_LOCKED)."""
    return str(error).startswith(("database is locked", "database table is locked"))
