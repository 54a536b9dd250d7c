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

The modules: `schema` (the table, its checksum, opening and migrating a file), `rows` (a record as a row and
back), `database` (`RunStore`: reading, writing, waiting for locks, spooling), `files` (JSON Lines export and
import), `checks` (one imported record against itself) and `conflicts` (records of one run against each other
and the store). Here: the names the commands and tests use.
"""

from gflbench.experiments.store.checks import REQUIRED_FIELDS, check_record
from gflbench.experiments.store.conflicts import RESULT_FIELDS, differing_from_stored, disagreements, distinct, identity
from gflbench.experiments.store.database import (
    DEFAULT_LOCK_WAIT,
    DEFAULT_STORE,
    LOCK_WAIT_ENV,
    RESULTS_ENV,
    RunStore,
    lock_wait,
)
from gflbench.experiments.store.files import Imported, read_records, write_records
from gflbench.experiments.store.rows import finite, round_seconds
from gflbench.experiments.store.schema import (  # the private two: tests/test_trust.py
    _COLUMNS,
    SCHEMA_VERSION,
    _checksum,
)

__all__ = [
    "DEFAULT_LOCK_WAIT", "DEFAULT_STORE", "LOCK_WAIT_ENV", "REQUIRED_FIELDS", "RESULTS_ENV", "RESULT_FIELDS",
    "SCHEMA_VERSION", "_COLUMNS", "Imported", "RunStore", "_checksum", "check_record", "differing_from_stored",
    "disagreements", "distinct", "finite", "identity", "lock_wait", "read_records", "round_seconds", "write_records",
]  # fmt: skip
