"""`gflbench export` and `import`: stored runs to a file and back, every record checked (gfl_bench/experiments/store/)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gflbench.commands.common import (
    FilterDatasetsOption,
    FilterMethodsOption,
    StoreOption,
    _say,
    _some,
    console,
    friendly,
    split_list,
)
from gflbench.errors import UserError
from gflbench.experiments.store import DEFAULT_STORE, RunStore


@friendly
def export(
    out: Annotated[Path, typer.Argument(help="File to write: JSON Lines, gzip-compressed if it ends in .gz.")],
    method: FilterMethodsOption = None,
    dataset: FilterDatasetsOption = None,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Write stored runs (whole records: curves, config, provenance) to one file, to move them to another
    machine or commit the runs behind a table; `gflbench import` reads it back."""
    from gflbench.experiments.store import write_records

    if not store.exists():
        raise UserError(f"no run store at {store}")
    methods_wanted = set(split_list(method, "methods")) if method else None
    datasets_wanted = set(split_list(dataset, "datasets")) if dataset else None
    with RunStore(store) as runs:
        records = [r for r in runs.records()
                   if (methods_wanted is None or r["method"] in methods_wanted)
                   and (datasets_wanted is None or r["dataset"] in datasets_wanted)]  # fmt: skip
    if not records:
        raise UserError(f"no stored runs in {store} match; nothing written")
    console.print(f"exported {write_records(out, records)} runs from {store} to {out}", soft_wrap=True)


@friendly
def import_runs(
    files: Annotated[list[Path], typer.Argument(help="Files written by `gflbench export`.")],
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Add the runs of exported files to the store: every record of every file is read and checked first
    (finite numbers, required fields, keys that follow from its config and seed, values that are its
    curves'), and records that disagree on a run are refused; then all new runs are stored in one
    transaction. A run already stored under the same execution (run key and execution key) is kept as it
    is, and said when it differs; another execution of a stored run is added beside it."""
    from gflbench.experiments.store import differing_from_stored, disagreements, distinct, read_records

    imported = [item for path in files for item in read_records(path)]
    clashes = disagreements(imported)
    if clashes:
        raise UserError(f"{len(clashes)} runs have records that disagree: {_some(clashes)}; nothing was imported")
    records = distinct(imported)
    with RunStore(store, _say) as runs:
        differ = differing_from_stored(runs, records)
        added = runs.put_many(records)
    console.print(f"imported {added} new runs into {store}; {len(records) - added} were already stored", soft_wrap=True)
    if differ:
        _say(
            f"{len(differ)} imported runs differ from the run stored under the same key, which was kept: {_some(differ)}"
        )
