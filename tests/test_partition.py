"""Split and partition invariants (paper B.3-B.4)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon
from torch_geometric.data import Data

from gflbench.data import tiny_graph
from gflbench.data.partition import (
    CLIENTS_PER_PART,
    DIRICHLET_MIN_NODES,
    TEST,
    TRAIN,
    VAL,
    cached_partition,
    check_clients,
    client_graphs,
    dirichlet_clients,
    louvain_clients,
    louvain_communities,
    make_partition,
    metis_parts,
    scheme_label,
    split_nodes,
)  # fmt: skip
from gflbench.errors import UserError


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


@pytest.mark.parametrize(
    ("scheme", "clients"), [("overlap", 7), ("overlap", 0), ("metis", 0), ("spectral", 5), ("louvain", 0)]
)
def test_impossible_client_counts_are_user_errors(scheme, clients):
    with pytest.raises(UserError):
        check_clients(scheme, clients)


# Schemes beyond the paper (issue 32): louvain and dirichlet-<alpha>.


def _cliques(sizes: list[int], bridges: list[tuple[int, int]]) -> Data:
    """Cliques of the given sizes on consecutive ids, joined by the `bridges` edges (both directions)."""
    edges, start = [], 0
    for size in sizes:
        edges += [(start + i, start + j) for i in range(size) for j in range(size) if i != j]
        start += size
    edges += bridges + [(v, u) for u, v in bridges]
    n = sum(sizes)
    return Data(x=torch.eye(n), y=torch.arange(n) % 2, edge_index=torch.tensor(edges).t())


@pytest.mark.parametrize(("given", "alpha", "label"), [
    ("metis", None, "metis"), ("overlap", None, "overlap"), ("louvain", None, "louvain"),
    ("dirichlet", 0.5, "dirichlet-0.5"), ("dirichlet", 1, "dirichlet-1.0"), ("dirichlet-.50", None, "dirichlet-0.5"),
])  # fmt: skip
def test_scheme_labels_are_canonical(given, alpha, label):
    assert scheme_label(given, alpha) == label


@pytest.mark.parametrize(("given", "alpha", "says"), [
    ("dirichlet", None, "needs --alpha"), ("dirichlet", 0.0, "positive"), ("dirichlet", -1.0, "positive"),
    ("dirichlet", float("nan"), "positive"), ("dirichlet-x", None, "not a number"), ("metis", 0.5, "dirichlet scheme only"),
    ("dirichlet-0.5", 0.5, "already names"), ("louvain-3", None, "dirichlet scheme only"), ("spectral", None, "unknown"),
])  # fmt: skip
def test_bad_schemes_are_user_errors(given, alpha, says):
    with pytest.raises(UserError, match=says):
        scheme_label(given, alpha)


def test_louvain_keeps_two_joined_cliques_whole():
    g = _cliques([5, 5], [(4, 5)])
    communities = louvain_communities(g.edge_index, g.num_nodes, seed=0)
    assert communities == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    p = make_partition(g, "louvain", 2, 1234, (0.2, 0.4, 0.4))
    assert [c.tolist() for c in p.client_nodes] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]


def test_louvain_merges_small_communities_and_cuts_large_ones():
    # capacity 12 // 2 = 6, slack 0: four 3-node communities pair up; a 12-node one is cut into two 6s
    assert louvain_clients([[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]], 12, 2) == [
        [0, 1, 2, 3, 4, 5],
        [6, 7, 8, 9, 10, 11],
    ]
    assert louvain_clients([list(range(12))], 12, 2) == [list(range(6)), list(range(6, 12))]
    # capacity 450 // 2 = 225, slack 20: a 150-node community stays whole (<= 205), a 300-node one is cut
    # into 205 + 95; largest first: 205 -> client 0, 150 -> client 1 (205 + 150 > 245), 95 -> client 1 (= 245)
    assert louvain_clients([list(range(300)), list(range(300, 450))], 450, 2) == [
        list(range(205)),
        list(range(205, 450)),
    ]


def test_louvain_refuses_more_clients_than_the_communities_allow():
    # communities above the capacity are cut, so the node count is the limit
    with pytest.raises(UserError, match="4 nodes are too few for 5 clients"):
        louvain_clients([[0, 1], [2, 3]], 4, 5)


def test_dirichlet_assigns_every_node_once_and_is_seeded():
    labels = np.repeat(np.arange(5), 400)
    a = dirichlet_clients(labels, 8, 0.5, seed=7)
    assert np.array_equal(np.sort(np.concatenate(a)), np.arange(labels.size))  # every node exactly once
    assert all(len(c) >= DIRICHLET_MIN_NODES for c in a)
    again = dirichlet_clients(labels, 8, 0.5, seed=7)
    assert all(np.array_equal(x, y) for x, y in zip(a, again))
    other = dirichlet_clients(labels, 8, 0.5, seed=8)
    assert not all(np.array_equal(x, y) for x, y in zip(a, other))


def test_dirichlet_skew_grows_as_alpha_falls():
    labels = np.repeat(np.arange(5), 400)
    overall = np.bincount(labels) / labels.size

    def divergence(alpha: float) -> float:
        clients = dirichlet_clients(labels, 8, alpha, seed=3)
        return float(np.mean([jensenshannon(np.bincount(labels[c], minlength=5) / len(c), overall, base=2)
                              for c in clients]))  # fmt: skip

    skew = [divergence(alpha) for alpha in (100.0, 1.0, 0.1)]
    assert skew[0] < 0.1 < skew[1] < skew[2]


def test_dirichlet_refuses_a_skew_that_empties_clients():
    with pytest.raises(UserError, match="larger alpha or fewer clients"):
        dirichlet_clients(np.repeat(np.arange(2), 30), 6, 0.01, seed=0)


def test_new_schemes_are_cached_by_their_setting(graph, tmp_path):
    half = cached_partition(graph, "tiny", "dirichlet-0.5", 5, 1234, (0.2, 0.4, 0.4), tmp_path)
    one = cached_partition(graph, "tiny", "dirichlet-1.0", 5, 1234, (0.2, 0.4, 0.4), tmp_path)
    louvain = cached_partition(graph, "tiny", "louvain", 5, 1234, (0.2, 0.4, 0.4), tmp_path)
    assert len({half.digest(), one.digest(), louvain.digest()}) == 3
    files = sorted(p.name for p in tmp_path.rglob("*.pt"))
    assert len(files) == 3 and any(f.startswith("dirichlet-0.5-M5") for f in files)
    stored = torch.load(next(tmp_path.rglob("dirichlet-0.5-*.pt")))
    assert stored["identity"]["setting"]["alpha"] == 0.5
    # a file copied over from another alpha is rebuilt, not used
    target = next(tmp_path.rglob("dirichlet-1.0-*.pt"))
    target.write_bytes(next(tmp_path.rglob("dirichlet-0.5-*.pt")).read_bytes())
    again = cached_partition(graph, "tiny", "dirichlet-1.0", 5, 1234, (0.2, 0.4, 0.4), tmp_path)
    assert again.digest() == one.digest()


def test_figures_name_every_scheme_by_its_own_title():
    """A convergence figure of a Louvain or Dirichlet run is not titled "overlapping" (it was, before)."""
    from gflbench.data.partition import scheme_title

    assert [scheme_title(s) for s in ("metis", "overlap", "louvain", "dirichlet-0.5", "file-0123456789abcdef")] == [
        "non-overlapping", "overlapping", "louvain", "dirichlet α=0.5", "split file 0123456789abcdef"]  # fmt: skip
