"""The runs a paper table needs: its grid of methods × datasets × partitions × client counts × seeds.

`gflbench sweep --table N` expands the table's grid here, keeps the runs the store lacks, and hands
them to `gflbench.experiments.execute`. A method the paper lists but this package does not implement yet is
reported as skipped, never silently dropped.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from gflbench.errors import UserError
from gflbench.experiments.protocol import DEFAULT_PROTOCOL
from gflbench.experiments.spec import RunSpec, make_spec
from gflbench.paper.tables import (
    ABLATIONS,
    CLIENTS,
    HETEROPHILIC,
    HOMOPHILIC,
    PAPER_METHOD_ORDER,
    SETTINGS,
    TIME_DATASETS,
)

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
    rows = (*ABLATIONS, "fedgmc") if table == "6" else PAPER_METHOD_ORDER
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


ROUND_TIMES_ENV = "GFLBENCH_ROUND_TIMES"
ROUND_TIMES_COLUMNS = ("method", "dataset", "scheme", "clients", "device", "seconds_per_round", "peak_mb", "machine")
# optional: `context_mb`, a CUDA process's memory outside torch's allocator, measured by bench/round_time.py


def default_round_times() -> Path:
    """The committed measurements (`bench/round_times.csv` of a checkout), or `GFLBENCH_ROUND_TIMES`."""
    return Path(os.environ.get(ROUND_TIMES_ENV) or Path(__file__).resolve().parent.parent / "bench" / "round_times.csv")


def load_round_times(path: Path | None = None) -> pd.DataFrame:
    """Measured seconds per round (evaluation included) from `bench/round_time.py --out`; empty if absent.

    The dry run's fallback when the store has no run of a cell: a fresh checkout can still plan a sweep.
    """
    path = default_round_times() if path is None else Path(path)
    if not path.is_file():
        return pd.DataFrame(columns=list(ROUND_TIMES_COLUMNS))
    frame = pd.read_csv(path)
    missing = [c for c in ROUND_TIMES_COLUMNS if c not in frame.columns]
    if missing:
        raise UserError(f"{path} lacks the column(s) {', '.join(missing)}; write it with bench/round_time.py --out")
    return frame


def estimate(
    specs: Sequence[RunSpec], runs: pd.DataFrame, measured: pd.DataFrame | None = None, device: str | None = None
) -> pd.DataFrame:
    """Planned runs per cell with an estimated time, and the basis each estimate rests on.

    Bases, first that applies: the store's median seconds per round (evaluation left out) for the same method,
    dataset, scheme and client count, of the cell's own configuration ("store, same configuration") or of any
    ("store"); else for the same method and dataset in other settings, preferring the cell's configuration, then
    its protocol, then any ("store, other settings"). A median of the closest runs, because a store also holds
    tuning trials of other widths and runs timed on a loaded machine: a mean over all of them put estimates 3-8x
    above the measured runs (docs/results.md, "Sweep estimates"). Then the measured table (`measured`, default `load_round_times()`, evaluation
    included): the same cell ("round_times.csv"), else the same method and dataset at the nearest
    measured client count, scaled in proportion to the client count (a rough rule: on these graphs a
    round's cost is mostly per-client work). `device` (e.g. "cpu", "cuda") keeps measured rows of that
    device type when there are any. NaN and basis "none": nothing to go on.
    """
    ok = runs[runs["status"] == "ok"] if len(runs) else runs
    table = load_round_times() if measured is None else measured
    if device is not None and len(table):
        same_device = _of_device_type(table, device)
        table = same_device if len(same_device) else table
    rows = []
    cells: dict[tuple[Any, ...], list[RunSpec]] = {}
    for spec in specs:
        cells.setdefault((spec.method, spec.dataset, spec.scheme, spec.clients), []).append(spec)
    for (method, dataset, scheme, clients), members in cells.items():
        per_round, basis = _stored_basis(ok, members)
        if basis == "none":
            per_round, basis = _measured_basis(table, method, dataset, scheme, clients)
        seconds = per_round * sum(s.rounds for s in members)
        rows.append({"method": method, "dataset": dataset, "scheme": scheme, "clients": clients,
                     "runs": len(members), "est. seconds": seconds, "basis": basis})  # fmt: skip
    return pd.DataFrame(rows, columns=["method", "dataset", "scheme", "clients", "runs", "est. seconds", "basis"])


def _of_device_type(table: pd.DataFrame, device: str) -> pd.DataFrame:
    """The measured rows of `device`'s type ("cuda:1" matches rows of any CUDA device)."""
    return table[table["device"].astype(str).str.split(":").str[0] == device.split(":")[0]]


NEWEST = 5  # an estimate reads the newest runs of its basis: older ones ran slower code, or on a busier machine


def _stored_basis(ok: pd.DataFrame, members: Sequence[RunSpec]) -> tuple[float, str]:
    """The median stored seconds per round of the runs closest to one cell's planned runs (`estimate`)."""
    if not len(ok):
        return math.nan, "none"
    first = members[0]
    same = ok[(ok["method"] == first.method) & (ok["dataset"] == first.dataset)]
    configured = same["config_key"].isin({spec.config_key for spec in members})
    protocol = same["protocol"] == first.protocol
    cell = (same["scheme"] == first.scheme) & (same["clients"] == first.clients)
    for rows, label in (
        (cell & configured, "store, same configuration"),
        (cell, "store"),
        (configured, "store, other settings, same configuration"),
        (protocol, f"store, other settings, {first.protocol}"),
        (same["method"] == first.method, "store, other settings"),
    ):
        if rows.any():
            newest = same[rows].sort_values("finished_at").tail(NEWEST)
            return float(newest["seconds_per_round"].median()), f"{label} ({len(newest)} runs)"
    return math.nan, "none"


def _measured_basis(table: pd.DataFrame, method: str, dataset: str, scheme: str, clients: int) -> tuple[float, str]:
    if not len(table):
        return math.nan, "none"
    same = table[(table["method"] == method) & (table["dataset"] == dataset)]
    exact = same[(same["scheme"] == scheme) & (same["clients"] == clients)]
    if len(exact):
        return float(exact["seconds_per_round"].mean()), "round_times.csv"
    if not len(same):
        return math.nan, "none"
    counts = same["clients"].astype(int)
    nearest = int(counts.iloc[(counts - clients).abs().argmin()])
    per_round = float(same.loc[counts == nearest, "seconds_per_round"].mean()) * clients / nearest
    return per_round, f"round_times.csv, scaled from {nearest} clients"


CUDA_CONTEXT_MB = 600.0  # per process, outside torch's allocator: the assumption until a GPU measures it
MEMORY_HEADROOM = 0.8  # share of the free memory the packed runs may plan to use
# Processes sharing one GPU at most. Without MPS the GPU time-slices between the processes' contexts, so
# more processes add contexts (memory) and switching, not throughput, once the GPU is busy; 8 is the
# largest count bench/gpu_check.sh measures (runs per hour at 1, 2, 4, 8 workers).
MAX_RUNS_PER_GPU = 8


def context_mb(measured: pd.DataFrame) -> tuple[float, str]:
    """A CUDA process's memory outside torch's allocator: the largest `context_mb` measured on CUDA
    (bench/round_time.py), else the `CUDA_CONTEXT_MB` assumption."""
    if len(measured) and "context_mb" in measured.columns:
        cuda = _of_device_type(measured, "cuda")["context_mb"].dropna()
        if len(cuda):
            return float(cuda.max()), "measured CUDA context"
    return CUDA_CONTEXT_MB, "assumed CUDA context"


def run_memory_mb(specs: Sequence[RunSpec], measured: pd.DataFrame, device: str) -> tuple[float, str]:
    """The memory (MB) one run's process needs among the planned cells, and where it comes from.

    From `measured` (bench/round_times.csv's `peak_mb`) on the same device type: the planned
    (method, dataset) pairs at any client count; a pair without a row takes the dataset's largest
    measured run of any method. On CUDA, `peak_mb` is what torch's allocator reserved at most in the
    run (runner.py `peak_reserved_bytes`, written by bench/round_time.py), and the process's CUDA
    context is added (`context_mb`). NaN when a planned dataset was never measured on this device type.
    """
    kind = device.split(":")[0]
    rows = _of_device_type(measured, device) if len(measured) else measured
    peaks: list[float] = []
    for method, dataset in sorted({(s.method, s.dataset) for s in specs}):
        same = rows[(rows["method"] == method) & (rows["dataset"] == dataset)] if len(rows) else rows
        if not len(same):
            same = rows[rows["dataset"] == dataset] if len(rows) else rows
        if not len(same):
            return math.nan, f"no {kind} measurement of {dataset} in round_times.csv"
        peaks.append(float(same["peak_mb"].max()))
    if not peaks:
        return math.nan, "nothing planned"
    if kind == "cuda":
        context, source = context_mb(measured)
        return max(peaks) + context, f"round_times.csv peak_mb + {context:.0f} MB {source}"
    return max(peaks), "round_times.csv peak_mb"


def packed_workers(run_mb: float, free_mb: float, cores: int, runs: int, cuda: bool) -> int:
    """How many runs to execute at once on one machine (`--workers 0`).

    Each run is a process with one thread, so never more than the CPU cores (on a GPU each process
    also needs a core to launch its kernels), nor more than there are runs, nor on a GPU more than
    `MAX_RUNS_PER_GPU`. Memory: the runs must fit in `MEMORY_HEADROOM` of the free memory (GPU memory
    on CUDA, RAM on a CPU); `run_mb` is one run's process (`run_memory_mb`: on CUDA its allocator's
    reserve and its CUDA context). An unmeasured run size (NaN) packs one run per core on a CPU, where
    a run's memory is small against RAM, and one run on a GPU.
    """
    by_cores = max(1, min(cores, runs, MAX_RUNS_PER_GPU if cuda else cores))
    if math.isnan(run_mb):
        return 1 if cuda else by_cores
    by_memory = max(1, int(free_mb * MEMORY_HEADROOM // run_mb))
    return min(by_cores, by_memory)


def free_memory_mb(device: str) -> float:
    """Free memory of the device a sweep runs on: the GPU's (torch) or the machine's available RAM."""
    if device.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return free / 2**20
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") / 2**20


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
