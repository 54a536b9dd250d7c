"""The transcription of the paper's tables: complete, self-consistent, and equal to the paper text."""

from __future__ import annotations

import math

import pytest
import raw_formats

from gflbench.paper.published import paper_results
from gflbench.paper.tables import HETEROPHILIC, HOMOPHILIC, PAPER_METHOD_ORDER

PAPER = raw_formats.REPO.parent / "shared" / "paper" / "fedgmc-paper.txt"


def paper_cell(table: int, method: str, dataset: str, scheme: str, clients: int | str) -> tuple[float, float] | None:
    """(mean, std) of one transcribed cell, or None when there is no such row; the library reads the whole
    frame (compare.py), so this lookup of single cells is the tests' own."""
    frame = paper_results()
    row = frame[(frame["table"] == table) & (frame["method"] == method) & (frame["dataset"] == dataset)
                & (frame["scheme"] == scheme) & (frame["clients"] == str(clients))]  # fmt: skip
    return None if row.empty else (float(row["mean"].iloc[0]), float(row["std"].iloc[0]))


def test_every_main_table_cell_is_there():
    frame = paper_results()
    for table, datasets, clients, scheme in ((1, HOMOPHILIC, (5, 10, 20), "metis"), (2, HETEROPHILIC, (5, 10, 20), "metis"),
                                             (4, HOMOPHILIC, (10, 30, 50), "overlap"), (5, HETEROPHILIC, (10, 30, 50), "overlap")):  # fmt: skip
        for method in PAPER_METHOD_ORDER:
            for dataset in datasets:
                for m in clients:
                    assert paper_cell(table, method, dataset, scheme, m) is not None, (table, method, dataset, m)
    assert len(frame[frame["table"] == 6]) == 11 * 4 * 6
    assert len(frame[frame["table"] == 7]) == 2 * 15 * 6


@pytest.mark.parametrize("table", [1, 4])
def test_avg_all_is_the_mean_of_the_row(table):
    frame = paper_results()
    for method in PAPER_METHOD_ORDER:
        row = frame[(frame["table"] == table) & (frame["method"] == method)]
        cells = row[row["dataset"] != "avg"]["mean"]
        published = row[(row["dataset"] == "avg") & (row["clients"] == "all")]["mean"].iloc[0]
        assert cells.mean() == pytest.approx(published, abs=0.015), method


def test_ablation_drop_matches_fedgmc():
    """Table 6 prints each variant's drop; our transcription must give the same difference."""
    assert paper_cell(6, "fedgmc", "cora", "metis", 10)[0] - paper_cell(6, "fedgmc-wo-structural", "cora", "metis", 10)[
        0
    ] == pytest.approx(8.39)
    assert math.isnan(paper_cell(7, "fedgmc", "cora", "metis", 10)[1])  # Table 7 has no std


@pytest.mark.skipif(not PAPER.exists(), reason="paper text not present")
@pytest.mark.parametrize(
    ("table", "method", "dataset", "scheme", "clients", "text"),
    [
        (1, "fedgmc", "cora", "metis", 10, "83.65$\\pm$0.16"),
        (1, "fedsage+", "amazon-photo", "metis", 10, "76.81$\\pm$8.24"),
        (2, "fedici", "minesweeper", "metis", 5, "86.35$\\pm$0.08"),
        (4, "fedpub", "ogbn-arxiv", "overlap", 50, "62.55$\\pm$0.12"),
        (5, "local", "questions", "overlap", 30, "57.17$\\pm$0.08"),
        (6, "fedgmc-wo-refinement", "tolokers", "overlap", 30, "72.53$\\pm$0.07"),
        (7, "fediih", "roman-empire", "overlap", 50, "100.10"),
    ],
)
def test_sample_cells_equal_the_paper_text(table, method, dataset, scheme, clients, text):
    mean, std = paper_cell(table, method, dataset, scheme, clients)
    rendered = f"{mean:.2f}" + ("" if math.isnan(std) else f"$\\pm${std:.2f}")
    assert rendered == text
    assert text in PAPER.read_text()
