"""The layouts of the paper's result tables from the store: Tables 1, 2, 4 and 5 (and custom ones), Table 6
(ablations) and Table 7 (cost), each a list of `Block`s (the paper splits wide tables into blocks of three
datasets, and Tables 6 and 7 into one block per dataset)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from gflbench.data import dataset_spec
from gflbench.data.partition import default_clients
from gflbench.paper.significance import FEW, PairedTest, compare_to_best
from gflbench.paper.tables.blocks import Band, Block, Cell, frame_of
from gflbench.paper.tables.catalog import ABLATIONS, RESULT_TABLES, SETTINGS, TIME_DATASETS
from gflbench.paper.tables.selection import Selection


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
    full = frame_of(text, columns), frame_of(values, columns), frame_of(marks, columns), frame_of(banded, columns)
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
        blocks.append(Block(frame_of(text, columns), frame_of(values, columns), higher_is_better=None))
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
        numbers = frame_of(values, columns)
        average = numbers.mean(axis=0, skipna=True)
        text["Average"] = ["" if math.isnan(v) else f"{v:.3f}" for v in average]
        numbers.loc["Average"] = average
        blocks.append(Block(frame_of(text, columns), numbers, higher_is_better=False))
    return blocks


def _with_memory(seconds: str, peak: Cell | None) -> str:
    """A Table 7 cell: seconds, then the peak memory where the runs recorded it."""
    if not seconds or peak is None or not peak.n:
        return seconds
    return f"{seconds} · {peak.mean:.0f} MB"
