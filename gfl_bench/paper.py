"""The paper's published numbers (Tables 1, 2, 4, 5, 6, 7), transcribed once into paper_results.csv.

Columns: table, method (CLI name; `average` is Table 7's Average row), dataset (CLI name; `avg` for
the Avg. columns), scheme (metis / overlap), clients (a count, or `all` for Avg. All), mean, std
(percent; seconds per round in Table 7, which has no std). Ablation rows are the registered
variant names (`fedgmc-wo-semantic`, ...).
"""

from __future__ import annotations

import functools
from importlib import resources

import pandas as pd


@functools.cache
def paper_results() -> pd.DataFrame:
    with resources.files("gfl_bench").joinpath("paper_results.csv").open() as handle:
        return pd.read_csv(handle, dtype={"clients": str})


def paper_cell(table: int, method: str, dataset: str, scheme: str, clients: int | str) -> tuple[float, float] | None:
    """(mean, std) of one published cell, or None when the paper has no such cell."""
    frame = paper_results()
    row = frame[(frame["table"] == table) & (frame["method"] == method) & (frame["dataset"] == dataset)
                & (frame["scheme"] == scheme) & (frame["clients"] == str(clients))]  # fmt: skip
    if row.empty:
        return None
    return float(row["mean"].iloc[0]), float(row["std"].iloc[0])
