"""The paper's Tables 1-7, built from the run store (Table 3 from the loaded datasets).

A cell holds the runs of one method on one dataset, scheme and client count whose configuration key
equals the one `gflbench run` would use with the same options, so a table never mixes
hyperparameters. Values are percentages with two decimals; std is the population std (ddof=0,
numpy's default, as in the FED-PUB analysis notebook) over seeds. A cell with fewer or more seeds than asked
shows `(n=k)`; a cell whose runs all failed shows `failed`; a cell without runs is empty. "Avg." is
the mean of a row's cell means, with the count of cells it covers when some are missing.

Every table is a list of `Block`s (the paper splits wide tables into blocks of three datasets, and
Tables 6 and 7 into one block per dataset); `render` writes blocks as terminal tables, Markdown,
LaTeX (best value bold, second underlined) or CSV.
"""

from __future__ import annotations

import dataclasses
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from gfl_bench.datasets import DATASETS, dataset_spec, is_available, load_dataset
from gfl_bench.errors import UserError
from gfl_bench.method import method_class
from gfl_bench.partition import default_clients
from gfl_bench.protocol import DEFAULT_PROTOCOL, PROTOCOLS, MissingTuning, hyperparameter_source
from gfl_bench.records import run_key_of
from gfl_bench.significance import FEW, PairedTest, compare_to_best
from gfl_bench.spec import RunSpec, execution_variants, make_spec

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult
    from rich.measure import Measurement

# The paper's row order (Tables 1-2); variants registered later are appended after these.
PAPER_METHOD_ORDER = (
    "local", "fedavg", "fedprox", "fedper", "gcfl", "fedgnn", "fedsage+", "fedpub", "fedgta",
    "adafgl", "fedtad", "fediih", "fedici", "fedssa", "fedgmc",
)  # fmt: skip
ABLATIONS = ("fedgmc-wo-semantic", "fedgmc-wo-structural", "fedgmc-wo-refinement")

HOMOPHILIC = ("cora", "citeseer", "pubmed", "amazon-computer", "amazon-photo", "ogbn-arxiv")
HETEROPHILIC = ("roman-empire", "amazon-ratings", "minesweeper", "tolokers", "questions")
SETTINGS = (("metis", 5), ("metis", 10), ("metis", 20), ("overlap", 10), ("overlap", 30), ("overlap", 50))
CLIENTS = {"metis": (5, 10, 20), "overlap": (10, 30, 50)}
TIME_DATASETS = ("cora", "roman-empire")
FORMATS = ("terminal", "markdown", "latex", "csv")
# How a run's reported value is chosen (docs/protocol.md, "Selection rules"): "global" = the test value
# at the run's best client-mean validation round (FED-PUB, the default); "per-client" = each client's
# test value at its own best validation round, then the client mean (FedICI's released code).
SELECTION_RULES = {"global": "", "per-client": "_client_best"}
VALUES = ("test", "val")  # what a cell shows: the test value, or the validation value that chose it

_HETERO_METRICS = (
    "Accuracy (%) for Roman-empire and Amazon-ratings, ROC-AUC (%) for Minesweeper, Tolokers and Questions."
)
CAPTIONS = {
    1: "Table 1: Accuracy (%) on six homophilic graphs, non-overlapping partitioning.",
    2: f"Table 2: Five heterophilic graphs, non-overlapping partitioning. {_HETERO_METRICS}",
    3: "Table 3: Statistics of the eleven graphs (after the largest connected component; undirected edges).",
    4: "Table 4: Accuracy (%) on six homophilic graphs, overlapping partitioning.",
    5: f"Table 5: Five heterophilic graphs, overlapping partitioning. {_HETERO_METRICS}",
    6: "Table 6: Ablations of FedGMC under non-overlapping and overlapping partitioning (↓: drop against FedGMC, ↑: gain).",
    7: "Table 7: Seconds per communication round (configure + local training + aggregation, evaluation excluded), "
    "and the runs' mean peak memory in MB (CUDA: torch's peak allocation; CPU: the worker process's peak RSS).",
}
RESULT_TABLES = {
    1: (HOMOPHILIC, "metis"),
    2: (HETEROPHILIC, "metis"),
    4: (HOMOPHILIC, "overlap"),
    5: (HETEROPHILIC, "overlap"),
}
ALL_TABLES = (1, 2, 3, 4, 5, 6, 7)


@dataclass(frozen=True)
class Cell:
    mean: float  # percent (seconds for Table 7)
    std: float
    n: int  # finished runs
    failed: int  # failed runs


@dataclass(frozen=True)
class Band:
    """A cell's execution band (docs/protocol.md, "Execution band"): how far one seed's value moves across
    the executions the store holds of it (executor, feature layout, stacking, device: gfl_bench/execution.py;
    execution switches such as FedIIH's routing kernel: gfl_bench/switches.py)."""

    spread: float  # the largest, over the cell's seeds, of max − min of one seed's values across executions
    seeds: int  # seeds stored under more than one execution
    executions: tuple[str, ...]  # the executions seen, each as its execution key and switch values

    def exceeds(self, cell: Cell | None) -> bool:
        """Whether the band is wider than the cell's seed std: then execution, not the seed, moves the cell most."""
        return cell is not None and cell.n > 0 and self.spread > cell.std


@dataclass(frozen=True)
class Block:
    """One rectangular piece of a table: text cells, the numbers behind them, and how to rank them."""

    text: pd.DataFrame  # rows: method titles; columns: (group, sub-column)
    values: pd.DataFrame  # same shape; NaN where there is no number
    higher_is_better: bool | None = True  # None: no bold/underline
    marks: pd.DataFrame | None = None  # same shape: a significance.Mark where a column was tested, else None
    test: PairedTest | None = None  # the test behind `marks`
    bands: pd.DataFrame | None = None  # same shape: a Band where a cell has one, else None
    verbatim: bool = False  # Markdown prints the text as written (tabulate would read "+0.020" as the number 0.02)


def _at_participation(runs: pd.DataFrame, participation: float) -> pd.DataFrame:
    """The rows run at `participation`: those whose run key is their configuration's at it (runs at F = 0.5
    and at 1 share the configuration key and differ in the run key only, `records.run_key_of`)."""
    if runs.empty:
        return runs
    columns = (runs[name] for name in ("config_key", "dataset", "scheme", "clients", "seed"))
    keys = [run_key_of(c, d, s, int(m), int(seed), participation) for c, d, s, m, seed in zip(*columns)]
    return runs[runs["run_key"] == pd.Series(keys, index=runs.index)]


@dataclass(frozen=True)
class Selection:
    """Which stored runs a table reads: the methods' configurations as `gflbench run` would resolve them."""

    runs: pd.DataFrame
    overrides: Mapping[str, Mapping[str, str]]
    rounds: int | None = None
    local_epochs: int | None = None
    expected_seeds: int = 10
    rule: str = "global"
    protocol: str = DEFAULT_PROTOCOL
    tuned: Path | None = None  # the `fair` protocol's folder of tuned values
    value: str = "test"  # "test", or "val" to choose settings by (never report validation as a result)
    # Every execution of every stored run (`RunStore.frame(every_execution=True)`), for execution bands; `runs`
    # holds the one execution per run that cells read. None: no bands.
    executions: pd.DataFrame | None = None
    # The fraction of clients sampled per round the runs used (`--participation`; docs/protocol.md): it shares
    # the configuration key, so cells keep the runs whose run key is their configuration's at this fraction.
    participation: float = 1.0

    def spec_of(self, method: str, dataset: str, scheme: str, clients: int) -> RunSpec | None:
        """Seed 0's spec of one cell under the selected protocol; None where `fair` has no tuned values."""
        try:
            overrides = rule_overrides(method, self.rule, self.overrides.get(method, {}))
            return make_spec(method, dataset, scheme, clients, 0, overrides, self.rounds, self.local_epochs,
                             protocol=self.protocol, tuned=self.tuned, participation=self.participation)  # fmt: skip
        except MissingTuning:
            return None

    def runs_of(self, method: str, dataset: str, scheme: str, clients: int) -> pd.DataFrame:
        """The stored runs (any status) of one cell under the selected protocol and configuration."""
        runs = self.runs
        spec = self.spec_of(method, dataset, scheme, clients)
        if runs.empty or spec is None:
            return runs.iloc[0:0]
        key = spec.config_key
        return _at_participation(runs[(runs["config_key"] == key) & (runs["method"] == method)
                                      & (runs["dataset"] == dataset) & (runs["scheme"] == scheme)
                                      & (runs["clients"] == clients)], self.participation)  # fmt: skip

    def run_keys(self, method: str, dataset: str, scheme: str, clients: int) -> list[str]:
        return list(self.runs_of(method, dataset, scheme, clients)["run_key"]) if len(self.runs) else []

    def seed_values(
        self, method: str, dataset: str, scheme: str, clients: int, column: str | None = None
    ) -> pd.Series | None:
        """One cell's finished runs' values indexed by seed (percent; s or MB for the cost columns), what tests
        pair on; None where the store predates the column."""
        chosen = self.runs_of(method, dataset, scheme, clients)
        column = column or self.value
        if column in ("test", "val"):
            column += SELECTION_RULES[self.rule]
        if column not in chosen:
            return None
        ok = chosen[chosen["status"] == "ok"].dropna(subset=[column])
        scale = {"seconds_per_round": 1.0, "peak_memory_bytes": 1.0 / 2**20}.get(column, 100.0)  # s, MB, percent
        return pd.Series(ok[column].to_numpy(float) * scale, index=ok["seed"])

    def band(self, method: str, dataset: str, scheme: str, clients: int) -> Band | None:
        """The cell's execution band, where the store holds some seed under more than one execution; else None.

        The executions of a seed are its records under the cell's run key (one per execution key) and under
        the run keys that differ from it in execution switches only (`spec.execution_variants`). The value is
        the one the cell shows (test or validation, under the selection rule)."""
        spec = self.spec_of(method, dataset, scheme, clients)
        runs = self.executions
        if runs is None or runs.empty or spec is None:
            return None
        variants = execution_variants(spec)
        column = self.value + SELECTION_RULES[self.rule]
        chosen = runs[runs["config_key"].isin(list(variants)) & (runs["method"] == method) & (runs["status"] == "ok")
                      & (runs["dataset"] == dataset) & (runs["scheme"] == scheme) & (runs["clients"] == clients)]  # fmt: skip
        chosen = _at_participation(chosen, self.participation)
        if column not in chosen:
            return None
        chosen = chosen.dropna(subset=[column])
        labels = (chosen["execution_key"] + " " + chosen["config_key"].map(variants)).str.strip()
        per_seed = chosen.assign(label=labels, value=chosen[column] * 100.0).groupby("seed")
        several = per_seed["label"].nunique() > 1
        if not several.any():
            return None
        spreads = per_seed["value"].agg(lambda v: v.max() - v.min())[several]
        seen = tuple(sorted(set(labels[chosen["seed"].isin(spreads.index)])))
        return Band(float(spreads.max()), int(several.sum()), seen)

    def cell(self, method: str, dataset: str, scheme: str, clients: int, column: str | None = None) -> Cell | None:
        chosen = self.runs_of(method, dataset, scheme, clients)
        if chosen.empty:
            return None
        ok = self.seed_values(method, dataset, scheme, clients, column)
        if ok is None:  # a store written before the column existed
            return None
        failed = int((chosen["status"] == "failed").sum())
        if ok.empty and not failed:
            return None
        if ok.empty:
            return Cell(math.nan, math.nan, 0, failed)
        return Cell(float(ok.mean()), float(ok.std(ddof=0)), len(ok), failed)

    def format(self, cell: Cell | None, decimals: int = 2, with_std: bool = True) -> str:
        if cell is None:
            return ""
        if cell.n == 0:
            return "failed"
        text = f"{cell.mean:.{decimals}f}" + (f"±{cell.std:.{decimals}f}" if with_std else "")
        notes = []
        if cell.n != self.expected_seeds:  # fewer or more seeds than the table asks for
            notes.append(f"n={cell.n}")
        if cell.failed:
            notes.append(f"{cell.failed} failed")
        return f"{text} ({', '.join(notes)})" if notes else text

    def caption(self, text: str) -> str:
        """A table caption that states the protocol and where the hyperparameters came from."""
        extra = "; with --set " + " ".join(
            f"{m}.{k}={v}" for m, values in sorted(self.overrides.items()) for k, v in sorted(values.items())
        ) if any(self.overrides.values()) else ""  # fmt: skip
        if self.participation != 1:
            text = f"{text.rstrip('.')}, participation F = {self.participation:g} (⌈F·M⌉ clients sampled per round)"
        return (f"{text.rstrip('.')}. Protocol: {self.protocol} ({PROTOCOLS[self.protocol]}); "
                f"{hyperparameter_source(self.protocol, self.tuned)}{extra}. Row labels name each method's backbone.")  # fmt: skip

    def row_label(self, method: str, title: str, settings: Sequence[tuple[str, str, int]]) -> str:
        """`Title [backbone]` over the table's cells, plus `≡ Other` where every cell provably computes another row."""
        specs = [s for s in (self.spec_of(method, d, sc, c) for d, sc, c in settings) if s is not None]
        backbones = sorted({s.params.backbone for s in specs})
        label = f"{title} [{'/'.join(backbones)}]" if backbones else title
        twins = {same_computation(s, self) for s in specs}
        if len(twins) == 1 and None not in twins:
            label += f" ≡ {method_class(twins.pop()).title}"
        return label


def same_computation(spec: RunSpec, sel: Selection) -> str | None:
    """The method whose run in `sel`'s configuration provably computes the same numbers as `spec`, if any.

    A method declares the condition (`Method.equivalent`: FedProx at one local epoch is FedAvg, FedGNN
    without cross-client matches is FedAvg); it holds only when the other method's resolved
    configuration equals the one the equivalence needs.
    """
    twin = method_class(spec.method).equivalent(spec.params, spec.scheme, spec.local_epochs)
    if twin is None:
        return None
    name, values = twin
    other = sel.spec_of(name, spec.dataset, spec.scheme, spec.clients)
    if other is None or other.rounds != spec.rounds or other.local_epochs != spec.local_epochs:
        return None
    return name if dataclasses.asdict(other.params) == values else None


def method_order(names: Sequence[str]) -> list[str]:
    known = [m for m in PAPER_METHOD_ORDER + ABLATIONS if m in names]
    return known + sorted(n for n in names if n not in known)


def result_cells(
    number: int, datasets: Sequence[str] | None = None, scheme: str | None = None
) -> tuple[list[str], str]:
    """The datasets and scheme of Table 1, 2, 4 or 5 (restricted to `datasets`), or of a custom table (number 0)."""
    if number:
        table_datasets, scheme = RESULT_TABLES[number]
        datasets = [d for d in table_datasets if datasets is None or d in datasets]
    return list(datasets or []), scheme


def results_table(number: int, sel: Selection, methods: Sequence[str], titles: Mapping[str, str],
                  datasets: Sequence[str] | None = None, scheme: str | None = None,
                  test: PairedTest = PairedTest(), clients: Sequence[int] | None = None) -> list[Block]:  # fmt: skip
    """Tables 1, 2, 4, 5 (or a custom one: number 0 with datasets and scheme): methods × datasets × clients.

    `clients`: a custom table's client counts where the scheme has no default (a split manifest's).

    Each dataset column is tested against its best mean (`significance.compare_to_best`); an entry
    with too few paired seeds says `n<k`. The Avg. columns are not tested.
    """
    datasets, scheme = result_cells(number, datasets, scheme)
    per_clients_avg = number in (2, 5)
    clients = clients or default_clients(
        scheme
    )  # the paper's counts for its schemes (= CLIENTS), 5/10/20 for the others
    cells = {(m, d, c): sel.cell(m, d, scheme, c) for m in methods for d in datasets for c in clients}
    bands = {(m, d, c): sel.band(m, d, scheme, c) for m in methods for d in datasets for c in clients}
    tested = {(d, c): compare_to_best({m: v for m in methods if (v := sel.seed_values(m, d, scheme, c)) is not None}, test)
              for d in datasets for c in clients}  # fmt: skip
    data_columns = [(dataset_spec(d).title, f"{c} Clients") for d in datasets for c in clients]
    avg_groups = [(f"{c} Clients", [(d, c) for d in datasets]) for c in clients] if per_clients_avg else []
    avg_groups.append(("All", [(d, c) for d in datasets for c in clients]))
    text: dict[str, list[str]] = {}
    values: dict[str, list[float]] = {}
    marks: dict[str, list] = {}
    banded: dict[str, list] = {}
    for m in methods:
        row = [cells[(m, d, c)] for d in datasets for c in clients]
        label = sel.row_label(m, titles[m], [(d, scheme, c) for d in datasets for c in clients if cells[(m, d, c)]])
        marks[label] = [tested[(d, c)].get(m) for d in datasets for c in clients]
        banded[label] = [bands[(m, d, c)] for d in datasets for c in clients]
        text[label] = [sel.format(cell) + (f" · n<{test.min_seeds}" if mark and mark.verdict == FEW else "")
                       + _band_text(band, cell) for cell, mark, band in zip(row, marks[label], banded[label])]  # fmt: skip
        values[label] = [cell.mean if cell else math.nan for cell in row]
        marks[label] += [None] * len(avg_groups)
        banded[label] += [None] * len(avg_groups)
        for _, members in avg_groups:
            present = [cells[(m, d, c)].mean for d, c in members if cells[(m, d, c)] and cells[(m, d, c)].n]
            mean = sum(present) / len(present) if present else math.nan
            text[label].append(
                ""
                if not present
                else f"{mean:.2f}" + ("" if len(present) == len(members) else f" ({len(present)}/{len(members)})")
            )
            values[label].append(mean)
    columns = data_columns + [("Avg.", name) for name, _ in avg_groups]
    full = _frame(text, columns), _frame(values, columns), _frame(marks, columns), _frame(banded, columns)
    blocks = []
    step = 3 * len(clients)
    for start in range(0, len(data_columns), step):
        cols = data_columns[start : start + step] + (
            columns[len(data_columns) :] if start + step >= len(data_columns) else []
        )
        has_band = any(b is not None for b in full[3][cols].to_numpy().ravel())
        blocks.append(Block(full[0][cols], full[1][cols], marks=full[2][cols], test=test,
                            bands=full[3][cols] if has_band else None))  # fmt: skip
    return blocks


def _band_text(band: Band | None, cell: Cell | None) -> str:
    """A cell's execution band beside its std: ` · exec 0.35` (`> std` where it is wider than the seed std)."""
    if band is None:
        return ""
    return f" · exec {band.spread:.2f}" + (" > std" if band.exceeds(cell) else "")


def ablation_table(sel: Selection, titles: Mapping[str, str], datasets: Sequence[str]) -> list[Block]:
    """Table 6: per dataset, the three ablations and FedGMC in six settings, each with its drop (↓)."""
    rows = [*ABLATIONS, "fedgmc"]
    blocks = []
    for d in datasets:
        columns = [
            (dataset_spec(d).title, f"{'non-overlapping' if s == 'metis' else 'overlapping'} {c} clients")
            for s, c in SETTINGS
        ]
        full = {(m, s, c): sel.cell(m, d, s, c) for m in rows for s, c in SETTINGS}
        text, values = {}, {}
        for m in rows:
            label = sel.row_label(m, titles[m], [(d, s, c) for s, c in SETTINGS if full[(m, s, c)]])
            text[label], values[label] = [], []
            for s, c in SETTINGS:
                cell, reference = full[(m, s, c)], full[("fedgmc", s, c)]
                entry = sel.format(cell)
                if m != "fedgmc" and cell and cell.n and reference and reference.n:
                    drop = reference.mean - cell.mean
                    entry += f" (↓ {drop:.2f})" if drop >= 0 else f" (↑ {-drop:.2f})"  # ↑: the ablation scored higher
                text[label].append(entry)
                values[label].append(cell.mean if cell else math.nan)
        blocks.append(Block(_frame(text, columns), _frame(values, columns), higher_is_better=None))
    return blocks


def time_table(
    sel: Selection, methods: Sequence[str], titles: Mapping[str, str], datasets: Sequence[str] = TIME_DATASETS
) -> list[Block]:
    """Table 7: seconds per round per method and setting, with the Average row over the methods shown."""
    blocks = []
    for d in datasets:
        columns = [
            (dataset_spec(d).title, f"{'non-overlapping' if s == 'metis' else 'overlapping'} {c} clients")
            for s, c in SETTINGS
        ]
        text, values = {}, {}
        for m in methods:
            cells = [sel.cell(m, d, s, c, column="seconds_per_round") for s, c in SETTINGS]
            memory = [sel.cell(m, d, s, c, column="peak_memory_bytes") for s, c in SETTINGS]
            label = sel.row_label(m, titles[m], [(d, s, c) for (s, c), cell in zip(SETTINGS, cells) if cell])
            text[label] = [
                _with_memory(sel.format(cell, decimals=3, with_std=False), peak) for cell, peak in zip(cells, memory)
            ]
            values[label] = [cell.mean if cell and cell.n else math.nan for cell in cells]
        numbers = _frame(values, columns)
        average = numbers.mean(axis=0, skipna=True)
        text["Average"] = ["" if math.isnan(v) else f"{v:.3f}" for v in average]
        numbers.loc["Average"] = average
        blocks.append(Block(_frame(text, columns), numbers, higher_is_better=False))
    return blocks


def _with_memory(seconds: str, peak: Cell | None) -> str:
    """A Table 7 cell: seconds, then the peak memory where the runs recorded it."""
    if not seconds or peak is None or not peak.n:
        return seconds
    return f"{seconds} · {peak.mean:.0f} MB"


def dataset_table(data_dir: Path) -> list[Block]:
    """Table 3 from the data: nodes, undirected edges, classes, features and metric, after preprocessing."""
    text, values = {}, {}
    columns = [("", "# Nodes"), ("", "# Edges"), ("", "# Classes"), ("", "# Features"), ("", "Metric"), ("", "Status")]
    for name, spec in DATASETS.items():
        if spec.synthetic:
            continue
        if is_available(name, data_dir):
            g = load_dataset(name, data_dir)
            stats = [g.num_nodes, g.num_edges // 2, int(g.y.max()) + 1, g.num_features]
            text[spec.title] = [f"{v:,}" for v in stats] + [spec.metric, "loaded"]
        else:
            stats = [math.nan] * 4
            text[spec.title] = [""] * 4 + [spec.metric, "absent"]
        values[spec.title] = [*stats, math.nan, math.nan]
    frame = _frame(text, columns)
    frame.index.name = "Dataset"
    return [Block(frame, _frame(values, columns), higher_is_better=None)]


def partition_table(data_dir: Path, scheme: str, counts: Sequence[int], data_seed: int) -> Block:
    """Table 3's second part (issue 32, item 5): how heterogeneous each loaded graph's `scheme` partition is at
    each client count, as `heterogeneity.setting_summary` puts a partition in one row (client means), so that
    a scheme's heterogeneity sits beside the graphs it splits. Partitions are made and cached as runs make them."""
    from gfl_bench.federation import DataCache
    from gfl_bench.heterogeneity import SETTING_COLUMNS, setting_summary

    cache = DataCache(data_dir, data_dir / "partitions")
    names = ("JS div.", "Quantity imbalance", "Homophily", "Client homophily", "Gap", "Missing")
    columns = [("", name) for name in names]
    text, values = {}, {}
    for name, spec in DATASETS.items():
        if spec.synthetic or not is_available(name, data_dir):
            continue
        for clients in counts:
            data = cache.federated(name, scheme, clients, data_seed)
            summary = setting_summary(cache.graph(name), data.graphs)
            row = [summary[column] for column in SETTING_COLUMNS]
            label = f"{spec.title}, {clients} clients"
            text[label] = [f"{v:+.3f}" if c == "Gap" else f"{v:.3f}" for c, v in zip(names, row)]
            values[label] = row
    frame = _frame(text, columns)
    frame.index.name = "Partition"
    return Block(frame, _frame(values, columns), higher_is_better=None, verbatim=True)


def _frame(rows: Mapping[str, list], columns: list[tuple[str, str]]) -> pd.DataFrame:
    frame = pd.DataFrame.from_dict(dict(rows), orient="index", columns=pd.MultiIndex.from_tuples(columns))
    frame.index.name = "Methods"
    return frame


def render(blocks: Sequence[Block], caption: str, fmt: str):
    """Blocks in one format: a string (markdown, latex, csv) or a rich renderable (terminal), which folds
    itself to the width of the console it is printed on (`FoldedTables`).

    Where the blocks carry significance marks, the caption gains what marks them in this format
    and the test behind them.
    """
    test = next((b.test for b in blocks if b.marks is not None and b.test is not None), None)
    if test is not None:
        caption = f"{caption.rstrip('.')}. {MARK_LEGENDS[fmt]}: {test.describe()}."
    if any(b.bands is not None for b in blocks):
        caption = f"{caption.rstrip('.')}. {BAND_LEGEND}."
    if fmt == "terminal":
        return FoldedTables(tuple(blocks), caption)
    writer = {"markdown": _markdown, "latex": _latex, "csv": _csv}[fmt]
    return "\n".join(writer(b, caption if i == 0 else f"{caption} (continued)") for i, b in enumerate(blocks))


_TOP = "the best mean of each dataset column and every method not significantly worse than it"
MARK_LEGENDS = {
    "terminal": f"†: {_TOP} (also bold on a terminal)",
    "markdown": f"Bold: {_TOP}",
    "latex": f"Bold: {_TOP}",
    "csv": "Columns '<column> top' (best; ns: not significantly worse than the best; worse; n<k: not tested) "
    "and '<column> p' (adjusted p against the best)",
}


BAND_LEGEND = (
    "exec X: the execution band, the largest spread (max − min) of one seed's value across the executions the "
    "store holds of it (per-client or batched, dense or sparse features, stacked seeds, device, kernel switches); "
    "'> std' where it is wider than the seed std (docs/protocol.md, \"Execution band\")"
)


def _top(block: Block) -> pd.DataFrame:
    """True where an entry is its column's best or not significantly worse than it."""
    assert block.marks is not None
    return block.marks.map(lambda mark: mark is not None and mark.top)


def _flat(frame: pd.DataFrame) -> pd.DataFrame:
    flat = frame.copy()
    flat.columns = [" ".join(p for p in col if p) for col in frame.columns]
    return flat


def _markdown(block: Block, caption: str) -> str:
    text = block.text if block.marks is None else block.text.mask(_top(block), "**" + block.text + "**")
    flat = _flat(text)
    aligned = {"disable_numparse": True, "colalign": ["left"] + ["right"] * len(flat.columns)} if block.verbatim else {}
    return f"**{caption}**\n\n{flat.to_markdown(**aligned)}\n"


def _csv(block: Block, caption: str) -> str:
    """The text columns, then per tested column its verdicts and adjusted p-values (for scripts)."""
    flat = _flat(block.text)
    if block.marks is not None:
        marks = _flat(block.marks)
        for column in marks.columns[marks.notna().any()]:
            flat[f"{column} top"] = marks[column].map(
                lambda m: "" if m is None else f"n<{block.test.min_seeds}" if m.verdict == FEW else m.verdict
            )
            flat[f"{column} p"] = marks[column].map(lambda m: "" if m is None or math.isnan(m.p) else f"{m.p:.4g}")
    if block.bands is not None:
        bands = _flat(block.bands)
        for column in bands.columns[bands.notna().any()]:
            flat[f"{column} exec"] = bands[column].map(lambda b: "" if b is None else f"{b.spread:.4g}")
    buffer = io.StringIO()
    flat.to_csv(buffer, lineterminator="\n")
    return f"# {caption}\n{buffer.getvalue()}"


def _latex(block: Block, caption: str) -> str:
    """Bold marks the significance group where a block was tested; else the best bold, the second underlined."""
    marked = block.text.copy()
    if block.marks is not None:
        marked = marked.mask(_top(block), marked.map(lambda s: rf"\textbf{{{s}}}"))
    elif block.higher_is_better is not None:
        for column in block.text.columns:
            ranked = block.values[column].drop(index="Average", errors="ignore").dropna()
            ranked = ranked.sort_values(ascending=not block.higher_is_better)
            for rank, style in enumerate((r"\textbf{%s}", r"\underline{%s}")):
                if len(ranked) > rank:
                    marked.loc[ranked.index[rank], column] = style % marked.loc[ranked.index[rank], column]
    symbols = {"±": r"$\pm$", "↓": r"$\downarrow$", "↑": r"$\uparrow$", "<": "$<$"}
    marked = marked.map(lambda s: "".join(symbols.get(ch, ch) for ch in s))
    body = marked.to_latex(multicolumn=True, multicolumn_format="c", escape=False)
    return f"% {caption}\n{body}"


# What a rich table adds to its columns' widths: one space of padding on each side of a cell and one border
# per column, plus the closing border.
_COLUMN_FRAME = 3
_TABLE_FRAME = 1


@dataclass(frozen=True)
class FoldedTables:
    """Blocks as terminal tables that never cut a value: a rich renderable folded to the console's width.

    rich fits a wide table into a narrow console by squeezing every column and cutting what no longer fits
    (`80.29±0.…`). Here a block whose columns do not fit side by side is folded instead: its data columns
    are split, in order, into groups that fit, each group a table of its own with the row labels repeated.
    A data column keeps the width of its widest cell, so a mean±std with its marks stays on one line;
    only where one column alone does not fit (a console of some 20 columns) does a cell wrap at its spaces,
    and never inside a number. Headers and row labels wrap, and fold a word longer than their column, but
    are never cut to `…`. Off a terminal the console is wide (cli `_plain`), so every block is one table.
    The caption is printed above the first table at the console's width, not as a table title, which
    rich would wrap at the table's width even in a piped line.
    """

    blocks: tuple[Block, ...]
    caption: str

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        from rich.text import Text

        yield Text(self.caption, no_wrap=False, overflow="fold")
        for block in self.blocks:
            yield from self._tables(block, console, options)

    @staticmethod
    def _tables(block: Block, console: Console, options: ConsoleOptions) -> RenderResult:
        from rich.measure import Measurement
        from rich.table import Table
        from rich.text import Text

        top = _top(block) if block.marks is not None else block.text.map(lambda _: False)
        labels = [Text(str(name)) for name in block.text.index]  # Text: `[gcn]` is not rich markup
        headers = [Text(f"{group}\n{sub}" if group else sub) for group, sub in block.text.columns]
        cells = [[Text(f"{v} †", style="bold") if m else Text(str(v)) for v, m in zip(block.text[c], top[c])]
                 for c in block.text.columns]  # fmt: skip

        def measure(texts: list[Text]) -> Measurement:  # (longest word, longest line) over a column's texts
            sizes = [Measurement.get(console, options, t) for t in texts]
            return Measurement(max(m.minimum for m in sizes), max(m.maximum for m in sizes))

        label = measure([*labels, Text(block.text.index.name or "")])
        full = [max(measure(column).maximum, measure([header]).maximum) for column, header in zip(cells, headers)]
        least = [measure(column).minimum for column in cells]  # a number is one word: never narrower than it
        for group, label_width, widths in _fold(options.max_width, label, full, least):
            t = Table()
            t.add_column(block.text.index.name or "", width=label_width, overflow="fold")
            for j, width in zip(group, widths):
                t.add_column(headers[j], justify="right", width=width, overflow="fold")
            for i, name in enumerate(labels):
                t.add_row(name, *(cells[j][i] for j in group))
            yield t


def _fold(
    width: int, label: Measurement, full: Sequence[int], least: Sequence[int]
) -> list[tuple[list[int], int, list[int]]]:
    """Groups of data columns (indices), each with the width of its label column and of its data columns,
    such that each group's table fits in `width` console columns.

    `label` is the label column's (longest word, longest line); `full[j]` the width column j needs for
    its widest cell and header line, `least[j]` for its longest word. All columns side by side at full
    width where they fit (the unfolded table); otherwise columns are taken in order while they fit at
    full width next to labels as wide as their longest word, and the room left goes to the labels. A
    column that does not fit alone at full width shares the room with the labels, half each where it
    needs that much, but never narrower than its longest word (a number); the labels get what remains
    (at least one character, folded).
    """
    frame = _TABLE_FRAME + _COLUMN_FRAME  # the label column's frame and the closing border
    if frame + label.maximum + sum(w + _COLUMN_FRAME for w in full) <= width:
        return [(list(range(len(full))), label.maximum, list(full))]
    label_width = label.minimum
    room = width - frame - label_width
    groups: list[list[int]] = []
    for j, w in enumerate(full):
        if groups and sum(full[k] + _COLUMN_FRAME for k in groups[-1]) + w + _COLUMN_FRAME <= room:
            groups[-1].append(j)
        else:
            groups.append([j])
    folded = []
    for group in groups:
        used = sum(full[k] + _COLUMN_FRAME for k in group)
        if used <= room:  # fits at full width: the labels take what is left, up to their longest line
            folded.append((group, min(label.maximum, width - frame - used), [full[k] for k in group]))
            continue
        (j,) = group  # one column wider than the room beside the labels: it and they share what there is
        shared = width - frame - _COLUMN_FRAME
        column = max(least[j], 1, min(full[j], shared - min(label_width, shared // 2)))
        folded.append((group, max(1, shared - column), [column]))
    return folded


def check_rule(rule: str) -> None:
    if rule not in SELECTION_RULES:
        raise UserError(f"unknown selection rule {rule!r}; choose from {', '.join(SELECTION_RULES)}")


def rule_overrides(method: str, rule: str, overrides: Mapping[str, str]) -> dict[str, str]:
    """One method's `--set` values under a selection rule: `per-client` adds the method's own per-client
    selection switch (`Method.per_client_selection`, e.g. AdaFGL's best epoch) where `--set` leaves it, so
    `run` and `table` with the same rule meet the same runs; `global` adds nothing."""
    check_rule(rule)
    switch = method_class(method).per_client_selection
    if rule != "per-client" or switch is None:
        return dict(overrides)
    field, value = switch
    return {field: value, **overrides}


def check_value(value: str) -> None:
    if value not in VALUES:
        raise UserError(f"unknown value {value!r}; choose from {', '.join(VALUES)}")


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise UserError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
