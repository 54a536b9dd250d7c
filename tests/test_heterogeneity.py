"""Heterogeneity statistics on a hand-made graph whose answers are worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch
from torch_geometric.data import Data

from gflbench.data.heterogeneity import client_statistics, quantity_imbalance, setting_summary, summary
from gflbench.data.partition import TEST, TRAIN, Partition, client_graphs


def _log2(x: float) -> float:
    return math.log(x, 2)


@pytest.fixture
def path_graph():
    """A path 0-1-2-3-4-5, labels 0 0 0 1 1 1; client A = {0, 1, 2, 3}, client B = {4, 5}."""
    edges = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    edge_index = torch.tensor(edges + [(v, u) for u, v in edges]).t()
    graph = Data(x=torch.eye(6), y=torch.tensor([0, 0, 0, 1, 1, 1]), edge_index=edge_index)
    split = torch.tensor([TRAIN, TRAIN, TEST, TEST, TRAIN, TEST], dtype=torch.int8)
    partition = Partition("hand", 0, split, (torch.tensor([0, 1, 2, 3]), torch.tensor([4, 5])))
    return graph, client_graphs(graph, partition)


def test_statistics_by_hand(path_graph):
    graph, clients = path_graph
    stats = client_statistics(graph, clients)
    a, b = stats.iloc[0], stats.iloc[1]
    assert (a["nodes"], a["edges"], a["train_labels"]) == (4, 3, 2)
    assert (b["nodes"], b["edges"], b["train_labels"]) == (2, 1, 1)
    # labels: A 3/4, 1/4 and B 0, 1 against the global 1/2, 1/2; JS divergence base 2 = mean KL to the midpoint
    js_a = 0.5 * (0.75 * _log2(0.75 / 0.625) + 0.25 * _log2(0.25 / 0.375)) + 0.5 * (
        0.5 * _log2(0.5 / 0.625) + 0.5 * _log2(0.5 / 0.375))  # fmt: skip
    js_b = 0.5 * (1.0 * _log2(1.0 / 0.75)) + 0.5 * (0.5 * _log2(0.5 / 0.25) + 0.5 * _log2(0.5 / 0.75))
    assert a["js"] == pytest.approx(js_a) and b["js"] == pytest.approx(js_b)
    # global edge homophily: 4 of 5 edges join one class; A keeps 0-1, 1-2, 2-3 (2 of 3), B keeps 4-5
    assert a["homophily"] == pytest.approx(2 / 3) and a["homophily_gap"] == pytest.approx(2 / 3 - 0.8)
    assert b["homophily"] == pytest.approx(1.0) and b["homophily_gap"] == pytest.approx(0.2)
    # missing neighbours: A's nodes have 7 edge ends, 3-4 leaves A; B's have 3, 4-3 leaves B
    assert a["missing"] == pytest.approx(1 / 7) and b["missing"] == pytest.approx(1 / 3)
    # sizes 4 and 2: population std 1 over mean 3
    assert quantity_imbalance(stats) == pytest.approx(1 / 3)
    table = summary(stats)
    assert table.loc["mean", "nodes"] == 3 and table.loc["min", "js"] == pytest.approx(min(js_a, js_b))
    assert table.loc["max", "missing"] == pytest.approx(1 / 3)


def test_a_setting_in_one_row_is_the_client_means_by_hand(path_graph):
    graph, clients = path_graph
    row = setting_summary(graph, clients)
    js_a = 0.5 * (0.75 * _log2(0.75 / 0.625) + 0.25 * _log2(0.25 / 0.375)) + 0.5 * (
        0.5 * _log2(0.5 / 0.625) + 0.5 * _log2(0.5 / 0.375))  # fmt: skip
    js_b = 0.5 * (1.0 * _log2(1.0 / 0.75)) + 0.5 * (0.5 * _log2(0.5 / 0.25) + 0.5 * _log2(0.5 / 0.75))
    assert row["js"] == pytest.approx((js_a + js_b) / 2)
    assert row["homophily"] == pytest.approx(0.8)  # the global graph's, which the gaps are measured from
    assert row["client_homophily"] == pytest.approx((2 / 3 + 1) / 2)
    assert row["homophily_gap"] == pytest.approx(((2 / 3 - 0.8) + 0.2) / 2)
    assert row["missing"] == pytest.approx((1 / 7 + 1 / 3) / 2) and row["quantity_imbalance"] == pytest.approx(1 / 3)


def test_a_client_without_edges_is_left_out_of_the_homophily_means(path_graph):
    graph, _ = path_graph
    parts = (torch.tensor([0, 1, 2, 3]), torch.tensor([5]))  # client B: one node, no edge
    row = setting_summary(graph, client_graphs(graph, Partition("hand", 0, torch.zeros(6, dtype=torch.int8), parts)))
    assert row["client_homophily"] == pytest.approx(2 / 3) and row["homophily_gap"] == pytest.approx(2 / 3 - 0.8)


def test_one_client_holding_everything_is_not_heterogeneous(path_graph):
    graph, _ = path_graph
    whole = client_graphs(graph, Partition("hand", 0, torch.zeros(6, dtype=torch.int8), (torch.arange(6),)))
    stats = client_statistics(graph, whole)
    assert stats.loc[0, "js"] == pytest.approx(0.0, abs=1e-12)
    assert stats.loc[0, "homophily_gap"] == pytest.approx(0.0) and stats.loc[0, "missing"] == 0.0
    assert quantity_imbalance(stats) == 0.0


def test_a_client_without_edges_has_no_homophily(path_graph):
    graph, _ = path_graph
    lone = client_graphs(graph, Partition("hand", 0, torch.zeros(6, dtype=torch.int8), (torch.tensor([0, 5]),)))
    stats = client_statistics(graph, lone)
    assert stats.loc[0, "edges"] == 0 and math.isnan(stats.loc[0, "homophily"])
    assert stats.loc[0, "missing"] == 1.0  # both nodes' neighbours are elsewhere


def test_partitions_writes_the_statistics_as_csv(tmp_path, monkeypatch):
    import io

    import pandas as pd
    from typer.testing import CliRunner

    from gflbench.commands.app import app

    monkeypatch.setenv("GFLBENCH_DATA", str(tmp_path / "data"))
    result = CliRunner().invoke(app, ["partitions", "-d", "tiny", "--clients", "5", "--partition", "dirichlet",
                                      "--alpha", "0.5", "-f", "csv"])  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(io.StringIO(result.stdout))
    clients = rows[rows["scope"] == "client"]
    assert len(clients) == 5 and clients["nodes"].sum() == 300  # dirichlet: every tiny node once
    mean = rows[rows["scope"] == "mean"].iloc[0]
    assert mean["js"] == pytest.approx(clients["js"].mean())
    sizes = clients["nodes"].to_numpy(dtype=float)
    assert mean["quantity_imbalance"] == pytest.approx(sizes.std() / sizes.mean(), rel=1e-5)
    bad = CliRunner().invoke(app, ["partitions", "-d", "tiny", "-f", "pdf"])
    assert bad.exit_code == 2 and "unknown format" in bad.stderr


def test_a_client_without_edges_shows_a_dash_for_its_homophily_not_nan():
    from gflbench.commands.listing import _or_dash

    assert _or_dash(float("nan"), ".3f") == "-" and _or_dash(float("nan"), "+.3f") == "-"
    assert _or_dash(0.5, "+.3f") == "+0.500" and _or_dash(0.0, ".3f") == "0.000"
