"""The results tables of one protocol's page: Tables 1, 2, 4, 5 (and one per scheme of the datasets no paper
table has) as HTML-ready rows with their marks, the paper's values and links to each cell's provenance, the
critical-difference diagram under each, and Table 6 (the ablations). The numbers are `gflbench.paper.tables`'
blocks and `gflbench.paper.significance`'s marks: nothing here computes a statistic of its own."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from gflbench.data import dataset_spec
from gflbench.errors import UserError
from gflbench.paper import plots, significance, tables
from gflbench.paper.published import SOURCES
from gflbench.paper.significance import BEST, FEW
from gflbench.report.site import Site
from gflbench.report.text import plain_table, scheme_words, slug


def table_numbers(stored: pd.DataFrame) -> list[int | tuple[str, tuple[str, ...]]]:
    """Tables 1, 2, 4, 5, then one table per scheme of the datasets no paper table has (e.g. `tiny`)."""
    paper_datasets = set(tables.HOMOPHILIC + tables.HETEROPHILIC)
    others = []
    for scheme in tables.CLIENTS:
        datasets = sorted(set(stored.loc[stored["scheme"] == scheme, "dataset"]) - paper_datasets)
        if datasets:
            others.append((scheme, tuple(datasets)))
    return [*tables.RESULT_TABLES, *others]


def board(site: Site, sel: tables.Selection, number: int | tuple[str, tuple[str, ...]], rows: Sequence[str],
          provenance: Mapping[tuple, dict], paper_index: Mapping[tuple, Any]) -> dict[str, Any] | None:  # fmt: skip
    """One results table: its blocks as HTML-ready rows, with marks, the paper's values and links to provenance."""
    test = site.options.test
    datasets, scheme = tables.result_cells(number) if isinstance(number, int) else number[::-1]
    stored = sel.runs[(sel.runs["scheme"] == scheme) & sel.runs["dataset"].isin(datasets)]
    rows = [m for m in rows if (stored["method"] == m).any()]  # a method without runs here is no row (and is slow)
    if not rows:
        return None
    if isinstance(number, int):
        blocks = tables.results_table(number, sel, rows, site.titles, test=test)
        caption, datasets, scheme, table = tables.CAPTIONS[number], *tables.result_cells(number), number
    else:
        scheme, datasets = number
        blocks = tables.results_table(0, sel, rows, site.titles, list(datasets), scheme, test)
        caption, table = (
            f"Datasets in no paper table ({', '.join(datasets)}), {scheme_words(scheme)} partitioning.",
            0,
        )
    if not any(
        b.values.notna().any().any() or b.text.isin(["failed", tables.NO_GLOBAL_MODEL]).any().any() for b in blocks
    ):
        return None
    caption = sel.caption(caption)
    if sel.rule != "global":
        caption = caption.rstrip(".") + f". Selection: {sel.rule} best validation round."
    by_title = {(dataset_spec(d).title, f"{c} Clients"): (d, c) for d in datasets for c in tables.CLIENTS[scheme]}
    label_of = dict(zip(rows, blocks[0].text.index))
    rendered = []
    for i, block in enumerate(blocks):
        rendered.append(_block(block, rows, label_of, by_title, scheme, table, provenance, paper_index, sel, i))
    board_id = slug(sel.protocol, f"table-{table}" if table else f"other-{scheme}")
    return {
        "id": board_id,
        "title": f"Table {table}" if table else f"Other datasets ({scheme})",
        "caption": caption,
        "legend": test.describe(),
        "blocks": rendered,
        "cd": cd_diagram(site, sel, rows, datasets, scheme, board_id),
    }


def _block(block: tables.Block, rows: Sequence[str], label_of: Mapping[str, str],
           by_title: Mapping[tuple[str, str], tuple[str, int]], scheme: str, table: int,
           provenance: Mapping[tuple, dict], paper_index: Mapping[tuple, Any], sel: tables.Selection,
           index: int) -> dict[str, Any]:  # fmt: skip
    """One block of a table (a group of columns): each entry with its classes (best, second, few), its hover
    text, its link to the cell's provenance and the paper's value, which it also hands to that provenance."""
    columns = list(block.text.columns)
    second = _second(block, columns)
    groups: list[list] = []
    for group, _ in columns:
        if groups and groups[-1][0] == group:
            groups[-1][1] += 1
        else:
            groups.append([group, 1])
    body = []
    for method in rows:
        label = label_of[method]
        if label not in block.text.index or not any(block.text.loc[label]):
            continue  # no runs of this method in these columns
        entries = []
        for column in columns:
            text = block.text.loc[label, column]
            mark = block.marks.loc[label, column] if block.marks is not None else None
            entry: dict[str, Any] = {"text": text, "classes": [], "href": None, "title": "", "paper": None}
            if mark is not None:
                entry["classes"].append({BEST: "best", FEW: "few"}.get(mark.verdict, mark.verdict))
                if not math.isnan(mark.p):
                    entry["title"] = f"Holm-adjusted p against the column's best: {mark.p:.3g} ({mark.n} paired seeds)"
            if second.get(column) == label:
                entry["classes"].append("second")
            setting = by_title.get(column)
            if setting is not None and text:
                d, c = setting
                cell = provenance.get((method, d, scheme, c))
                if cell is not None:
                    entry["href"] = f"#cell-{cell['id']}"
                    entry["title"] = "; ".join(filter(None, (cell["hover"], entry["title"])))
                published = paper_index.get((table, method, d, scheme, c))
                if published is not None:
                    entry["paper"] = {
                        "text": f"{published.paper:.2f}" + ("" if math.isnan(published.paper_std) else f"±{published.paper_std:.2f}"),
                        "source": published.source,
                        "flag": bool(published.flag),
                        "gap": f"{published.gap:+.2f}",
                    }  # fmt: skip
                    if cell is not None:
                        cell["paper"] = {**entry["paper"], "source_text": SOURCES[published.source], "table": table}
            entries.append(entry)
        body.append({"label": label, "cells": entries})
    return {"groups": groups, "columns": columns, "rows": body, "continued": index > 0}


def _second(block: tables.Block, columns: Sequence[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Per tested column, the row with the highest mean after the best among the tested entries (not `few`)."""
    second: dict[tuple[str, str], str] = {}
    if block.marks is None:
        return second
    for column in columns:
        marks = block.marks[column]
        tested = [label for label, m in marks.items() if m is not None and m.verdict not in (BEST, FEW)]
        if tested:
            second[column] = max(tested, key=lambda label: block.values.loc[label, column])
    return second


def cd_diagram(site: Site, sel: tables.Selection, rows: Sequence[str], datasets: Sequence[str], scheme: str,
               board_id: str) -> dict[str, str | None]:  # fmt: skip
    """The critical-difference diagram over a table's cells, as `gflbench plot ranks` draws it, or why not."""
    cells = [(d, scheme, c) for d in datasets for c in tables.CLIENTS[scheme]]
    means, dropped_methods, dropped_cells = significance.cell_means(sel, rows, cells, named=False)
    left_out = "; ".join(dropped_methods + dropped_cells) or "none"
    try:
        analysis = significance.rank_analysis(means, site.options.test.alpha)
    except UserError as error:
        return {"missing": f"No critical-difference diagram: {error} (at least {significance.RANK_MIN_SEEDS} "
                           f"seeds each; left out: {left_out})."}  # fmt: skip
    caption = significance.rank_caption(analysis, sel.protocol, sel.rule, left_out)
    path = site.figure(lambda out: plots.ranks(analysis, site.titles, caption, out, (".svg",)), f"cd-{board_id}")
    return {"src": path, "caption": caption}


def ablations(site: Site, sel: tables.Selection, stored: pd.DataFrame) -> dict[str, Any] | None:
    """Table 6 as `gflbench table 6` builds it, for the datasets with ablation runs."""
    datasets = [d for d in tables.HOMOPHILIC + tables.HETEROPHILIC
                if ((stored["dataset"] == d) & stored["method"].isin(tables.ABLATIONS)).any()]  # fmt: skip
    if not datasets:
        return None
    blocks = tables.ablation_table(sel, site.titles, datasets)
    if not any(b.values.notna().any().any() for b in blocks):
        return None
    return {"caption": sel.caption(tables.CAPTIONS[6]), "html": [plain_table(b.text) for b in blocks]}
