"""What the paper's grid costs: the runs `gflbench sweep --table all` still has to make, with `sweep.estimate`'s
hours, and the whole grid on one CPU worker from the round times bench/grid_cost.py measured."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from gflbench.core.method import all_methods
from gflbench.data import dataset_spec
from gflbench.experiments.spec import RunSpec
from gflbench.paper import plots, tables
from gflbench.report.site import Site

GRID_SEEDS = 10  # the paper's seeds per cell: the grid `gflbench sweep --table all` runs
GRID_COST_CSV = "grid_cost.csv"  # bench/: seconds per round of every method on every dataset (bench/grid_cost.py)
GRID_COST_PATH = f"bench/{GRID_COST_CSV}"
GRID_COST_BASE = ("metis", 10)  # the setting bench/grid_cost.py times every dataset at
GRID_COST_RATIO_DATASET = "cora"  # timed at every setting, to carry the others there
GRID_COST_REFERENCE = "fedavg"  # timed on every dataset first: a method not timed on a dataset is scaled from it


def grid_cost(site: Site) -> dict[str, Any]:
    """What `gflbench sweep --table all` (protocol paper, seeds 0-9) still has to run, and how long that takes by
    `sweep.estimate` (the stored runs' seconds per round, else bench/round_times.csv), per table and in all.
    One estimate for the whole grid; a table's share of a cell is its runs' share (a cell's runs have one schedule)."""
    from gflbench.experiments.execute import pending
    from gflbench.paper.sweep import SWEEP_TABLES, estimate, grid_specs, load_round_times, table_grid

    registered = list(site.registered)
    parts = {f"Table {t}": grid_specs(table_grid(t, registered), GRID_SEEDS, {}) for t in SWEEP_TABLES}
    parts["Sensitivity"] = [
        s for d in plots.SENSITIVITY_DATASETS for s in plots.sensitivity_specs(d, "metis", 10, GRID_SEEDS)
    ]
    keyed = {name: {s.run_key: s for s in specs} for name, specs in parts.items()}
    every = {key: spec for specs in keyed.values() for key, spec in specs.items()}
    key_of = {id(spec): key for key, spec in every.items()}
    todo = pending(list(every.values()), site.runs, False, False)
    missing = {key_of[id(spec)]: spec for spec in todo}
    measured = load_round_times()
    plan = estimate(todo, site.frame, measured, device="cpu")
    cells = zip(plan["method"], plan["dataset"], plan["scheme"], plan["clients"], plan["est. seconds"], plan["runs"])
    per_run = {
        (m, d, sc, c): seconds / runs for m, d, sc, c, seconds, runs in cells if runs and not math.isnan(seconds)
    }
    rows = []
    for name, specs in [*keyed.items(), ("All (each run once)", every)]:
        known = [per_run[cell] for key in specs if key in missing
                 if (cell := (specs[key].method, specs[key].dataset, specs[key].scheme, specs[key].clients)) in per_run]  # fmt: skip
        rows.append({"name": name, "runs": len(specs), "missing": sum(key in missing for key in specs),
                     "with_basis": len(known), "hours": f"{sum(known) / 3600:.1f}"})  # fmt: skip
    devices = sorted(set(measured["device"].astype(str).str.split(":").str[0])) if len(measured) else []
    return {"rows": rows, "seeds": GRID_SEEDS, "measured_devices": ", ".join(devices) or "none",
            "gpu": "cuda" in devices, "whole": whole_grid_cost(keyed, every)}  # fmt: skip


def grid_cost_csv() -> Path:
    """bench/grid_cost.csv of the checkout: every method's seconds per round on every paper dataset (bench/grid_cost.py)."""
    return Path(__file__).resolve().parent.parent.parent / "bench" / GRID_COST_CSV


def whole_grid_cost(parts: Mapping[str, Mapping[str, RunSpec]], every: Mapping[str, RunSpec]) -> dict[str, Any]:
    """What every run of the paper grid costs on one CPU worker, from bench/grid_cost.csv: a run's seconds are its
    rounds × its method's seconds per round on its dataset at METIS 10 clients × that method's ratio, on Cora,
    of the run's setting to METIS 10 (1 where Cora lacks either round, said). A method not timed on a dataset is
    FedAvg's time there times the method's Cora time over FedAvg's (said apart). Per part of the grid: the hours,
    the hours resting on generated stand-ins or on that scaling, and the runs whose basis is a bound or one round."""
    path = grid_cost_csv()
    if not path.is_file():
        return {"rows": [], "matrix": None, "path": GRID_COST_PATH, "machine": ""}
    table = pd.read_csv(path)
    rows_of = {(r.method, r.dataset, r.scheme, int(r.clients)): r for r in table.itertuples(index=False)}
    no_ratio: set[tuple[str, str, int]] = set()

    def per_run(spec: RunSpec) -> tuple[float, str, bool, bool] | None:
        row, scale, scaled = rows_of.get((spec.method, spec.dataset, *GRID_COST_BASE)), 1.0, False
        if row is None:  # FedAvg's row on the dataset, times the method's Cora round over FedAvg's
            row = rows_of.get((GRID_COST_REFERENCE, spec.dataset, *GRID_COST_BASE))
            own, reference = (
                rows_of.get((m, GRID_COST_RATIO_DATASET, *GRID_COST_BASE)) for m in (spec.method, GRID_COST_REFERENCE)
            )
            if row is None or own is None or reference is None:
                return None
            scale, scaled = own.seconds_per_round / reference.seconds_per_round, True
            status = own.status if own.status != "measured" else row.status
        else:
            status = row.status
        ratio = 1.0
        if (spec.scheme, spec.clients) != GRID_COST_BASE:
            at, base = (
                rows_of.get((spec.method, GRID_COST_RATIO_DATASET, *k))
                for k in ((spec.scheme, spec.clients), GRID_COST_BASE)
            )
            if at is not None and base is not None and at.status == base.status == "measured":
                ratio = at.seconds_per_round / base.seconds_per_round
            else:
                no_ratio.add((spec.method, spec.scheme, spec.clients))
        return (
            row.seconds_per_round * scale * ratio * spec.rounds,
            status,
            str(row.graph).startswith("stand-in"),
            scaled,
        )

    rows = []
    for name, specs in [*parts.items(), ("All (each run once)", every)]:
        costs = [c for c in map(per_run, specs.values()) if c is not None]
        rows.append({
            "name": name, "runs": len(specs), "with_basis": len(costs),
            "hours": f"{sum(c[0] for c in costs) / 3600:,.1f}",
            "stand_in_hours": f"{sum(c[0] for c in costs if c[2]) / 3600:,.1f}",
            "scaled_hours": f"{sum(c[0] for c in costs if c[3]) / 3600:,.1f}",
            "bounded": sum(c[1] in ("lower bound", "warm-up only") for c in costs),
            "single": sum(c[1] == "1 round" for c in costs),
        })  # fmt: skip
    datasets = [d for d in tables.HOMOPHILIC + tables.HETEROPHILIC if (table["dataset"] == d).any()]
    methods = tables.method_order([m for m in table["method"].unique() if m in all_methods()])
    marks = {"measured": "", "1 round": "¹", "warm-up only": "ʷ", "lower bound": "≥"}
    matrix = []
    for method in methods:
        entries = []
        for dataset in datasets:
            row = rows_of.get((method, dataset, *GRID_COST_BASE))
            if row is None:
                entries.append({"text": "", "classes": ""})
                continue
            text = f"{row.seconds_per_round:.2f}"
            entries.append({"text": ("≥" + text) if row.status == "lower bound" else text + marks[row.status].replace("≥", ""),
                            "classes": " ".join(c for c in ("stand-in" if str(row.graph).startswith("stand-in") else "",
                                                              "bound" if row.status != "measured" else "") if c)})  # fmt: skip
        matrix.append({"method": all_methods()[method].title, "cells": entries})
    graphs = [
        {"dataset": dataset_spec(d).title, "graph": table.loc[table["dataset"] == d, "graph"].iloc[0]} for d in datasets
    ]
    return {"rows": rows, "path": GRID_COST_PATH, "machine": "; ".join(sorted(set(table["machine"].astype(str)))),
            "datasets": [dataset_spec(d).title for d in datasets], "matrix": matrix, "graphs": graphs,
            "no_ratio": ", ".join(f"{m} {s}-{c}" for m, s, c in sorted(no_ratio)) or "none",
            "ratio_dataset": dataset_spec(GRID_COST_RATIO_DATASET).title}  # fmt: skip
