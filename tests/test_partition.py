"""Split and partition invariants (paper B.3-B.4)."""

from __future__ import annotations

import pytest
import torch

from gfl_bench.datasets import tiny_graph
from gfl_bench.errors import UserError
from gfl_bench.partition import (
    CLIENTS_PER_PART, TEST, TRAIN, VAL, cached_partition, check_clients, client_graphs, make_partition, metis_parts, split_nodes,
)  # fmt: skip


@pytest.fixture(scope="module")
def graph():
    return tiny_graph()


def test_split_ratios_and_cover():
    split = split_nodes(1000, (0.2, 0.4, 0.4), seed=7)
    assert (split == TRAIN).sum() == 200
    assert (split == TEST).sum() == 400
    assert (split == VAL).sum() == 400
    arxiv = split_nodes(1000, (0.05, 0.475, 0.475), seed=7)
    assert (arxiv == TRAIN).sum() == 50 and (arxiv == TEST).sum() == 475


def test_split_depends_on_seed_only():
    assert torch.equal(split_nodes(500, (0.2, 0.4, 0.4), 3), split_nodes(500, (0.2, 0.4, 0.4), 3))
    assert not torch.equal(split_nodes(500, (0.2, 0.4, 0.4), 3), split_nodes(500, (0.2, 0.4, 0.4), 4))


@pytest.mark.parametrize("clients", [5, 10])
def test_metis_is_a_disjoint_cover(graph, clients):
    p = make_partition(graph, "metis", clients, 1234, (0.2, 0.4, 0.4))
    assert p.num_clients == clients
    everything = torch.cat(p.client_nodes)
    assert everything.numel() == graph.num_nodes  # no node twice
    assert torch.equal(everything.sort().values, torch.arange(graph.num_nodes))  # no node lost
    assert all(c.numel() > 0 for c in p.client_nodes)


def test_overlap_counts_and_halves(graph):
    clients = 10
    p = make_partition(graph, "overlap", clients, 1234, (0.2, 0.4, 0.4))
    assert p.num_clients == clients
    parts = clients // CLIENTS_PER_PART
    membership = metis_parts(graph.edge_index, graph.num_nodes, parts, 1234)
    for cid, nodes in enumerate(p.client_nodes):
        part = (membership == cid // CLIENTS_PER_PART).nonzero().view(-1)
        assert nodes.numel() == len(set(nodes.tolist()))  # a client holds a node once
        assert nodes.numel() == part.numel() // 2  # a random half of its METIS part
        assert set(nodes.tolist()) <= set(part.tolist())
    # clients of one part overlap, and differ
    a, b = set(p.client_nodes[0].tolist()), set(p.client_nodes[1].tolist())
    assert a & b and a != b


def test_client_graphs_slice_the_global_split(graph):
    p = make_partition(graph, "metis", 5, 1234, (0.2, 0.4, 0.4))
    for nodes, g in zip(p.client_nodes, client_graphs(graph, p)):
        assert torch.equal(g.global_id, nodes)
        assert torch.equal(g.train_mask, p.split[nodes] == TRAIN)
        assert torch.equal(g.y, graph.y[nodes])
        assert int(g.edge_index.max()) < nodes.numel()  # induced and relabelled
        assert g.train_mask.sum() + g.val_mask.sum() + g.test_mask.sum() == nodes.numel()


def test_partition_cache_roundtrip(graph, tmp_path):
    first = cached_partition(graph, "tiny", "metis", 5, 1234, (0.2, 0.4, 0.4), tmp_path)
    assert len(list(tmp_path.rglob("*.pt"))) == 1
    second = cached_partition(graph, "tiny", "metis", 5, 1234, (0.2, 0.4, 0.4), tmp_path)
    assert first.digest() == second.digest()
    other_seed = cached_partition(graph, "tiny", "metis", 5, 99, (0.2, 0.4, 0.4), tmp_path)
    assert other_seed.digest() != first.digest()


@pytest.mark.parametrize(("scheme", "clients"), [("overlap", 7), ("overlap", 0), ("metis", 0), ("louvain", 5)])
def test_impossible_client_counts_are_user_errors(scheme, clients):
    with pytest.raises(UserError):
        check_clients(scheme, clients)
