"""Ours against the paper, cell by cell: the reviewer's question "does this number reproduce?".

A cell is compared when the store has at least one finished run for it (under the configuration
`gflbench run` resolves with the same options) and the paper publishes it. It is flagged when the gap
exceeds max(1 point, 2 × the paper's std). Table 7 (seconds per round) is listed as a ratio and never
flagged: times depend on the machine. The closing summary gives, per method, the cells compared, the
mean absolute gap and how many are within 1 point, and whether the paper's ranking (FedGMC first on
average) holds over the cells that every compared method has.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from gflbench.experiments.protocol import PROTOCOLS, hyperparameter_source
from gflbench.paper.published import SOURCES, paper_results, paper_source
from gflbench.paper.tables import PAPER_METHOD_ORDER, Selection, method_order

COMPARABLE_TABLES = (1, 2, 4, 5, 6, 7)


@dataclass(frozen=True)
class Comparison:
    cells: pd.DataFrame  # one row per compared cell
    summary: pd.DataFrame  # one row per method
    ranking: pd.DataFrame  # methods by their mean over the common cells, ours and the paper's
    fedgmc_first: bool | None  # None when FedGMC or a rival has no common cell


def compare(sel: Selection, methods: Sequence[str], tables: Sequence[int] = COMPARABLE_TABLES) -> Comparison:
    paper = paper_results()
    paper = paper[paper["table"].isin(tables) & (paper["dataset"] != "avg") & paper["method"].isin(methods)]
    paper = paper[~((paper["table"] == 6) & (paper["method"] == "fedgmc"))]  # same cells as Tables 1, 2, 4, 5
    rows = []
    for row in paper.itertuples(index=False):
        is_time = row.table == 7
        cell = sel.cell(
            row.method, row.dataset, row.scheme, int(row.clients), "seconds_per_round" if is_time else "test"
        )
        if cell is None or cell.n == 0:
            continue
        gap = cell.mean - row.mean
        spec = sel.spec_of(row.method, row.dataset, row.scheme, int(row.clients))
        threshold = math.nan if is_time else max(1.0, 2 * (0.0 if math.isnan(row.std) else row.std))
        rows.append({
            "table": row.table, "method": row.method, "dataset": row.dataset, "scheme": row.scheme,
            "clients": int(row.clients), "backbone": spec.params.backbone if spec else "", "seeds": cell.n,
            "ours": cell.mean, "ours_std": cell.std, "source": paper_source(row.table, row.method),
            "paper": row.mean, "paper_std": row.std, "gap": gap,
            "ratio": cell.mean / row.mean if is_time else math.nan,
            "flag": (not is_time) and abs(gap) > threshold,
        })  # fmt: skip
    cells = pd.DataFrame(rows, columns=["table", "method", "dataset", "scheme", "clients", "backbone", "seeds", "ours",
                                        "ours_std", "source", "paper", "paper_std", "gap", "ratio", "flag"])  # fmt: skip
    accuracy = cells[cells["table"] != 7]
    summary = pd.DataFrame(
        [
            {
                "method": m,
                "cells": len(group),
                "mean abs gap": group["gap"].abs().mean(),
                "within 1 point": int((group["gap"].abs() <= 1.0).sum()),
                "flagged": int(group["flag"].sum()),
            }
            for m, group in accuracy.groupby("method", sort=False)
        ],
        columns=["method", "cells", "mean abs gap", "within 1 point", "flagged"],
    )
    if not summary.empty:
        summary = summary.set_index("method").loc[method_order(list(summary["method"]))].reset_index()
    ranking, first = _ranking(accuracy[accuracy["method"].isin(PAPER_METHOD_ORDER)])
    return Comparison(cells, summary, ranking, first)


def _ranking(cells: pd.DataFrame) -> tuple[pd.DataFrame, bool | None]:
    """Mean over the (table, dataset, scheme, clients) cells that every compared method has."""
    if cells.empty:
        return pd.DataFrame(columns=["method", "ours", "paper"]), None
    key = ["table", "dataset", "scheme", "clients"]
    counts = cells.groupby(key)["method"].nunique()
    methods = cells["method"].nunique()
    common = counts[counts == methods].index
    chosen = cells.set_index(key).loc[lambda f: f.index.isin(common)].reset_index()
    if chosen.empty:
        return pd.DataFrame(columns=["method", "ours", "paper"]), None
    ranking = chosen.groupby("method")[["ours", "paper"]].mean().sort_values("ours", ascending=False).reset_index()
    ranking.insert(1, "common cells", len(common))
    if "fedgmc" not in set(ranking["method"]) or len(ranking) < 2:
        return ranking, None
    return ranking, ranking["method"].iloc[0] == "fedgmc"


def to_markdown(result: Comparison, titles: dict[str, str], sel: Selection) -> str:
    """The report, headed by the protocol and selection rule of `sel`, the selection it was computed from."""
    lines = [
        f"Our values: protocol {sel.protocol} ({PROTOCOLS[sel.protocol]}); {hyperparameter_source(sel.protocol, sel.tuned)}; "
        f"selection rule: {sel.rule} best validation round (docs/protocol.md). `backbone` is ours for that cell.",
        "", "## Cells", "",
    ]  # fmt: skip
    if result.cells.empty:
        return "\n".join(lines[:1]) + "\n\nNo stored run matches a published cell.\n"
    shown = result.cells.copy()
    shown["method"] = shown["method"].map(titles)
    shown["ours"] = [
        f"{o:.3f} s" if t == 7 else f"{o:.2f}±{s:.2f}"
        for t, o, s in zip(shown["table"], shown["ours"], shown["ours_std"])
    ]
    shown["paper"] = [
        f"{p:.2f} s" if t == 7 else f"{p:.2f}±{s:.2f}"
        for t, p, s in zip(shown["table"], shown["paper"], shown["paper_std"])
    ]
    shown["gap"] = [
        f"×{r:.3f}" if t == 7 else f"{g:+.2f}" + (" ⚑" if f else "")
        for t, g, r, f in zip(shown["table"], shown["gap"], shown["ratio"], shown["flag"])
    ]
    columns = ["table", "method", "dataset", "scheme", "clients", "backbone", "seeds", "ours", "paper", "source", "gap"]
    lines.append(shown[columns].to_markdown(index=False))
    lines += [
        "",
        "⚑: gap larger than max(1 point, 2 × the paper's std). Table 7 gaps are ratios ours / paper (machine-dependent, never flagged).",
        "",
    ]
    lines += [
        "Sources of the paper's cells (docs/protocol.md): most baseline cells are inherited from earlier papers, not re-run.",
        "",
    ]
    lines += [f"- `{key}`: {text}" for key, text in SOURCES.items() if key in set(shown["source"])]
    lines += [""]
    lines += ["## Per method (accuracy / ROC-AUC cells)", ""]
    summary = result.summary.copy()
    summary["method"] = summary["method"].map(titles)
    lines.append(summary.to_markdown(index=False, floatfmt=".2f"))
    lines += ["", "## Ranking over the cells every compared method has", ""]
    if result.ranking.empty:
        lines.append("No cell is shared by all compared methods.")
    else:
        ranking = result.ranking.copy()
        ranking["method"] = ranking["method"].map(titles)
        lines.append(ranking.to_markdown(index=False, floatfmt=".2f"))
        verdict = {None: "not decidable (FedGMC, or a rival, has no common cell)",
                   True: "yes", False: "no"}[result.fedgmc_first]  # fmt: skip
        lines += ["", f"FedGMC first on average in our runs (the paper's claim): **{verdict}**."]
    return "\n".join(lines) + "\n"
