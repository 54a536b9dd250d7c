"""Mean±std tables in the layout of the paper's Tables 1, 2, 4 and 5, built from the run store.

A cell holds the runs of one method on one dataset, scheme and client count whose configuration key
equals the one `gflbench run` would use with the same options, so a table never mixes
hyperparameters. Values are percentages, two decimals; std is the population std (ddof=0, numpy's
default, as in the FED-PUB analysis notebook) over seeds. A cell with fewer seeds than asked shows
`(n=k)`; a cell without runs is empty. "Avg" is the mean of a row's cell means, with the count of
cells it covers when some are missing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from gfl_bench.datasets import dataset_spec
from gfl_bench.errors import UserError
from gfl_bench.partition import SCHEMES
from gfl_bench.spec import make_spec

# The paper's row order (Tables 1-2); variants registered later are appended after these.
PAPER_METHOD_ORDER = (
    "local", "fedavg", "fedprox", "fedper", "gcfl", "fedgnn", "fedsage+", "fedpub", "fedgta",
    "adafgl", "fedtad", "fediih", "fedici", "fedssa", "fedgmc",
)  # fmt: skip

HOMOPHILIC = ("cora", "citeseer", "pubmed", "amazon-computer", "amazon-photo", "ogbn-arxiv")
HETEROPHILIC = ("roman-empire", "amazon-ratings", "minesweeper", "tolokers", "questions")


@dataclass(frozen=True)
class TableLayout:
    number: int
    caption: str
    datasets: tuple[str, ...]
    scheme: str
    per_clients_avg: bool  # Tables 2 and 5 also average per client count


TABLES: dict[int, TableLayout] = {
    1: TableLayout(1, "Accuracy (%) on six homophilic graphs, non-overlapping partitioning.", HOMOPHILIC, "metis", False),
    2: TableLayout(
        2,
        "Five heterophilic graphs, non-overlapping partitioning. Accuracy (%) for Roman-empire and "
        "Amazon-ratings, ROC-AUC (%) for Minesweeper, Tolokers and Questions.",
        HETEROPHILIC, "metis", True,
    ),
    4: TableLayout(4, "Accuracy (%) on six homophilic graphs, overlapping partitioning.", HOMOPHILIC, "overlap", False),
    5: TableLayout(
        5,
        "Five heterophilic graphs, overlapping partitioning. Accuracy (%) for Roman-empire and "
        "Amazon-ratings, ROC-AUC (%) for Minesweeper, Tolokers and Questions.",
        HETEROPHILIC, "overlap", True,
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Cell:
    mean: float  # percent
    std: float  # percent
    n: int


def method_order(names: Sequence[str]) -> list[str]:
    known = [m for m in PAPER_METHOD_ORDER if m in names]
    return known + sorted(n for n in names if n not in PAPER_METHOD_ORDER)


def collect_cells(
    runs: pd.DataFrame,
    methods: Sequence[str],
    datasets: Sequence[str],
    scheme: str,
    clients: Sequence[int],
    overrides: Mapping[str, Mapping[str, str]],
    rounds: int | None = None,
    local_epochs: int | None = None,
) -> dict[tuple[str, str, int], Cell]:
    """Mean and std of the reported test value per (method, dataset, clients), current configs only."""
    ok = runs[runs["status"] == "ok"] if len(runs) else runs
    cells: dict[tuple[str, str, int], Cell] = {}
    for method in methods:
        for dataset in datasets:
            key = make_spec(
                method, dataset, scheme, clients[0], 0, overrides.get(method, {}), rounds, local_epochs
            ).config_key
            chosen = ok[(ok["method"] == method) & (ok["dataset"] == dataset) & (ok["scheme"] == scheme)
                        & (ok["config_key"] == key)] if len(ok) else ok  # fmt: skip
            for m in clients:
                values = chosen[chosen["clients"] == m]["test"].dropna() * 100 if len(chosen) else []
                if len(values):
                    cells[(method, dataset, m)] = Cell(float(values.mean()), float(values.std(ddof=0)), len(values))
    return cells


def build_frame(
    cells: Mapping[tuple[str, str, int], Cell],
    methods: Sequence[str],
    datasets: Sequence[str],
    clients: Sequence[int],
    expected_seeds: int,
    per_clients_avg: bool,
    titles: Mapping[str, str],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The table as text cells (rows = method titles) and the numeric means used for ranking."""
    columns = [(dataset_spec(d).title, f"{m} Clients") for d in datasets for m in clients]
    text: dict[str, list[str]] = {}
    numbers: dict[str, list[float]] = {}
    for method in methods:
        row_text, row_num = [], []
        for d in datasets:
            for m in clients:
                cell = cells.get((method, d, m))
                row_num.append(cell.mean if cell else math.nan)
                row_text.append(_format(cell, expected_seeds))
        avg_cols = []
        if per_clients_avg:
            for m in clients:
                avg_cols.append([cells.get((method, d, m)) for d in datasets])
        avg_cols.append([cells.get((method, d, m)) for d in datasets for m in clients])
        for group in avg_cols:
            present = [c.mean for c in group if c]
            value = sum(present) / len(present) if present else math.nan
            row_num.append(value)
            row_text.append(_format_avg(value, len(present), len(group)))
        text[titles[method]] = row_text
        numbers[titles[method]] = row_num
    if per_clients_avg:
        columns += [("Avg.", f"{m} Clients") for m in clients]
    columns.append(("Avg.", "All"))
    index = pd.MultiIndex.from_tuples(columns)
    frame = pd.DataFrame.from_dict(text, orient="index", columns=index)
    values = pd.DataFrame.from_dict(numbers, orient="index", columns=index)
    frame.index.name = values.index.name = "Methods"
    return frame, values


def _format(cell: Cell | None, expected: int) -> str:
    if cell is None:
        return ""
    text = f"{cell.mean:.2f}±{cell.std:.2f}"
    return text if cell.n >= expected else f"{text} (n={cell.n})"


def _format_avg(value: float, present: int, total: int) -> str:
    if not present:
        return ""
    return f"{value:.2f}" if present == total else f"{value:.2f} ({present}/{total})"


def table_layout(number: int) -> TableLayout:
    if number not in TABLES:
        raise UserError(f"table {number} is not a results table; choose from {', '.join(map(str, TABLES))}")
    return TABLES[number]


def to_markdown(frame: pd.DataFrame, caption: str) -> str:
    flat = frame.copy()
    flat.columns = [f"{d} {c}" if d != "Avg." else f"Avg. {c}" for d, c in frame.columns]
    return f"**{caption}**\n\n" + flat.to_markdown() + "\n"


def to_csv(frame: pd.DataFrame) -> str:
    flat = frame.copy()
    flat.columns = [f"{d} / {c}" for d, c in frame.columns]
    return flat.to_csv()


def to_latex(frame: pd.DataFrame, values: pd.DataFrame, caption: str) -> str:
    """LaTeX tabular with the best value of each column in bold and the second underlined."""
    marked = frame.copy()
    for column in frame.columns:
        ranked = values[column].dropna().sort_values(ascending=False)
        for rank, style in zip(range(2), (r"\textbf{%s}", r"\underline{%s}")):
            if len(ranked) > rank:
                row = ranked.index[rank]
                marked.loc[row, column] = style % marked.loc[row, column]
    marked = marked.map(lambda s: s.replace("±", r"$\pm$"))
    body = marked.to_latex(multicolumn=True, multicolumn_format="c", escape=False)
    return f"% {caption}\n" + body
