"""Cost as the work grows: no client may build a dense N×N matrix (checked on the arxiv-sized graph)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from gflbench.core.method import all_methods
from gflbench.data import dataset_spec
from gflbench.experiments.runner import DataCache, FederatedData, run
from gflbench.experiments.spec import make_spec

# FedSage+'s generator phase alone takes minutes on a 17k-node client; its tensors are per node × P slots.
SKIPPED = {"fedsage+"}
# One round must stay one round's work: AdaFGL's whole stage 2 (200 local epochs by default) runs in
# its first round, so the check runs it with one epoch (the memory it builds per epoch is the same).
SETTINGS = {"adafgl": {"stage2_epochs": "1"}}


class NoDenseSquare(TorchDispatchMode):
    """Fails on any op whose output is a dense tensor with two trailing dimensions of at least `n`."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor) and tensor.layout == torch.strided and tensor.dim() >= 2:
                assert min(tensor.shape[-2:]) < self.n, f"{func} built a dense {tuple(tensor.shape)} tensor"
        return out


@pytest.fixture(scope="module")
def biggest_client() -> FederatedData:
    """The arxiv-sized graph's METIS-10 federation reduced to its largest client."""
    full = DataCache(None, None).federated("synthetic-arxiv-size", "metis", 10, 1234)
    largest = max(full.graphs, key=lambda g: g.num_nodes)
    return dataclasses.replace(full, graphs=[largest], prepared={})


def test_the_arxiv_sized_graph_has_arxivs_shape():
    graph = DataCache(None, None).graph("synthetic-arxiv-size")
    assert graph.num_nodes == 169_343 and graph.num_features == 128 and int(graph.y.max()) + 1 == 40
    assert 1.0e6 < graph.num_edges / 2 < 1.4e6  # ogbn-arxiv: 1.17 M undirected edges
    assert dataset_spec("synthetic-arxiv-size").synthetic


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(all_methods()) - SKIPPED))
def test_no_method_builds_a_dense_node_by_node_matrix(biggest_client, name):
    n = biggest_client.graphs[0].num_nodes
    spec = make_spec(
        name,
        "synthetic-arxiv-size",
        "metis",
        10,
        0,
        {"hidden": "64", **SETTINGS.get(name, {})},
        rounds=1,
        local_epochs=1,
    )
    with NoDenseSquare(n):
        record = run(spec, biggest_client, torch.device("cpu"))
    assert record["status"] == "ok" and n > 10_000


def test_the_check_catches_a_dense_square():
    x = torch.randn(120, 8)
    with pytest.raises(AssertionError, match="dense"), NoDenseSquare(100):
        x @ x.T  # what a dense adjacency or a pairwise-similarity matrix would be
    with NoDenseSquare(100):
        x.T @ x  # 8 × 8 is fine
