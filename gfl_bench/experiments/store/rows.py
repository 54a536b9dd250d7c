"""A record as a row of the store and back: strict JSON (finite numbers or null), the summary columns tables
filter on, the seconds per round they show, and which execution of a run tables read."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

from gflbench.core.execution import execution_key, execution_rank
from gflbench.experiments.store.schema import _COLUMNS, _checksum


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
