"""The runs a paper table needs: its grid of methods × datasets × partitions × client counts × seeds.

`gflbench sweep --table N` expands the table's grid here, keeps the runs the store lacks, and hands
them to `gfl_bench.execute`. A method the paper lists but this package does not implement yet is
reported as skipped, never silently dropped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from gfl_bench.errors import UserError
from gfl_bench.protocol import DEFAULT_PROTOCOL
from gfl_bench.spec import RunSpec, make_spec
from gfl_bench.tables import ABLATIONS, CLIENTS, HETEROPHILIC, HOMOPHILIC, PAPER_METHOD_ORDER, SETTINGS, TIME_DATASETS

SWEEP_TABLES = ("1", "2", "4", "5", "6", "7")


@dataclass(frozen=True)
class Grid:
    methods: tuple[str, ...]
    datasets: tuple[str, ...]
    settings: tuple[tuple[str, int], ...]  # (scheme, clients)
    skipped: tuple[str, ...] = ()  # methods the table has but this package lacks


def table_grid(table: str, registered: Sequence[str]) -> Grid:
    """The grid of one paper table, restricted to implemented methods."""
    if table not in SWEEP_TABLES:
        raise UserError(f"no sweep for table {table!r}; choose from {', '.join(SWEEP_TABLES)}")
    rows = ABLATIONS + ("fedgmc",) if table == "6" else PAPER_METHOD_ORDER
    methods = tuple(m for m in rows if m in registered)
    skipped = tuple(m for m in rows if m not in registered)
    if table == "6":
        return Grid(methods, HOMOPHILIC + HETEROPHILIC, SETTINGS, skipped)
    if table == "7":
        return Grid(methods, TIME_DATASETS, SETTINGS, skipped)
    datasets = HOMOPHILIC if table in ("1", "4") else HETEROPHILIC
    scheme = "metis" if table in ("1", "2") else "overlap"
    return Grid(methods, datasets, tuple((scheme, c) for c in CLIENTS[scheme]), skipped)


def grid_specs(
    grid: Grid,
    seeds: int,
    overrides: Mapping[str, Mapping[str, str]],
    rounds: int | None = None,
    local_epochs: int | None = None,
    protocol: str = DEFAULT_PROTOCOL,
    tuned: Path | None = None,
) -> list[RunSpec]:
    """Every run of the grid, datasets outermost (so each dataset's data is loaded once per worker)."""
    return [
        make_spec(m, d, scheme, clients, seed, overrides.get(m, {}), rounds, local_epochs, protocol=protocol, tuned=tuned)
        for d in grid.datasets for scheme, clients in grid.settings for m in grid.methods for seed in range(seeds)
    ]  # fmt: skip


def estimate(specs: Sequence[RunSpec], runs: pd.DataFrame) -> pd.DataFrame:
    """Planned runs per cell with an estimated time from stored seconds per round.

    The estimate uses the mean stored seconds per round of the same method, dataset, scheme and client
    count, else of the same method and dataset; evaluation time is not included. NaN: no basis.
    """
    ok = runs[runs["status"] == "ok"] if len(runs) else runs
    rows = []
    cells: dict[tuple, list[RunSpec]] = {}
    for spec in specs:
        cells.setdefault((spec.method, spec.dataset, spec.scheme, spec.clients), []).append(spec)
    for (method, dataset, scheme, clients), members in cells.items():
        per_round = math.nan
        if len(ok):
            same = ok[(ok["method"] == method) & (ok["dataset"] == dataset)]
            exact = same[(same["scheme"] == scheme) & (same["clients"] == clients)]
            basis = exact if len(exact) else same
            if len(basis):
                per_round = float(basis["seconds_per_round"].mean())
        seconds = per_round * sum(s.rounds for s in members)
        rows.append({"method": method, "dataset": dataset, "scheme": scheme, "clients": clients,
                     "runs": len(members), "est. seconds": seconds})  # fmt: skip
    return pd.DataFrame(rows, columns=["method", "dataset", "scheme", "clients", "runs", "est. seconds"])
