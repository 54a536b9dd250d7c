"""Backbone operators and layouts."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data

from gflbench.backbones import BACKBONES, GCN, H2GCN
from gflbench.backbones.graph_ops import dense_if_no_larger, h2gcn_adjacencies


def _path_graph(n: int) -> Data:
    src = torch.arange(n - 1)
    edge_index = torch.cat([torch.stack([src, src + 1]), torch.stack([src + 1, src])], dim=1)
    return Data(x=torch.eye(n), edge_index=edge_index, num_nodes=n)


def test_h2gcn_neighbourhoods_are_1hop_and_strict_2hop():
    hop1, hop2 = h2gcn_adjacencies(_path_graph(5).edge_index, 5)
    one, two = hop1.to_dense() > 0, hop2.to_dense() > 0
    assert one[2].nonzero().view(-1).tolist() == [1, 3]  # neighbours, not the node itself
    assert two[2].nonzero().view(-1).tolist() == [0, 4]  # exactly two hops away
    assert two[0].nonzero().view(-1).tolist() == [2]
    assert not (one & two).any() and not one.diagonal().any() and not two.diagonal().any()
    # symmetric normalisation by each operator's own degrees: node 0 (deg 1) - node 1 (deg 2)
    assert hop1.to_dense()[0, 1].item() == pytest.approx(1 / 2**0.5)


def test_h2gcn_representations_and_head():
    graph = _path_graph(6)
    H2GCN.prepare(graph)
    model = H2GCN(6, 8, 3, 0.0)
    reps = model.representations(graph)
    assert reps.ego.shape == (6, 8) and reps.hop1.shape == (6, 8) and reps.hop2.shape == (6, 8)
    assert reps.combined.shape == (6, 7 * 8)
    assert torch.equal(reps.ego, torch.relu(model.ego(graph.x)))  # structure-free
    assert model(graph).shape == (6, 3) and H2GCN.head == "classifier"


@pytest.mark.parametrize(("name", "activation"), [("h2gcn-tanh", torch.tanh), ("h2gcn-elu", torch.nn.functional.elu)])
def test_h2gcn_variants_change_only_the_ego_activation(name, activation):
    graph = _path_graph(6)
    H2GCN.prepare(graph)
    torch.manual_seed(0)
    variant = BACKBONES[name](6, 8, 3, 0.0)
    reps = variant.representations(graph)
    assert torch.equal(reps.ego, activation(variant.ego(graph.x)))
    assert (reps.ego < 0).any()  # signed, unlike ReLU's
    plain = H2GCN(6, 8, 3, 0.0)
    plain.load_state_dict(variant.state_dict())  # same parameters, so weights average across both
    assert torch.equal(plain.representations(graph).ego, torch.relu(variant.ego(graph.x)))


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_every_backbone_classifies_every_node(name):
    graph = _path_graph(7)
    BACKBONES[name].prepare(graph)
    model = BACKBONES[name](7, 16, 4, 0.5)
    assert model(graph).shape == (7, 4)
    assert any(k.startswith(model.head + ".") for k in model.state_dict())


def test_gcn_matches_pyg_message_passing():
    graph = _path_graph(5)
    GCN.prepare(graph)
    model = GCN(5, 4, 2, 0.0).eval()
    from torch_geometric.nn import GCNConv

    reference = GCNConv(5, 4)
    reference.load_state_dict(model.conv1.state_dict())
    torch.testing.assert_close(model.conv1(graph.x, graph.gcn_adj), reference(graph.x, graph.edge_index))


def test_prepared_graphs_are_cached_per_backbone_option(tiny_federation, device, monkeypatch):
    """A backbone that reads a Params field in `prepare` gets one prepared copy per value of it."""
    import dataclasses

    from gflbench import backbones
    from gflbench.core.method import MethodParams

    class Scaled(backbones.GCN):
        options = ("hidden",)

        @staticmethod
        def prepare(graph, params=None):
            backbones.GCN.prepare(graph, params)
            graph.scale = torch.tensor(float(params.hidden))

    monkeypatch.setitem(backbones.BACKBONES, "scaled-test", Scaled)
    narrow = dataclasses.replace(MethodParams(), backbone="scaled-test", hidden=8)
    wide = dataclasses.replace(narrow, hidden=32)
    assert tiny_federation.on_device(narrow, device)[0].scale == 8.0
    assert tiny_federation.on_device(wide, device)[0].scale == 32.0  # not the copy prepared for hidden=8
    assert tiny_federation.on_device(narrow, device)[0].scale == 8.0
    model = backbones.build_backbone(wide, tiny_federation.num_features, tiny_federation.num_classes)
    assert isinstance(model, Scaled) and model.conv1.out_channels == 32


@pytest.mark.parametrize("name", ["gcn", "h2gcn-tanh"])
def test_sparse_first_layer_gives_the_dense_logits_and_gradients(tiny_federation, device, name):
    import dataclasses

    from gflbench.backbones import build_backbone
    from gflbench.core.method import MethodParams

    params = dataclasses.replace(MethodParams(), backbone=name, hidden=16)
    dense_graph = tiny_federation.on_device(params, device)[0]
    sparse_graph = tiny_federation.on_device(params, device)[0]
    sparse_graph.x_sparse = sparse_graph.x.to_sparse_csr()
    torch.manual_seed(0)
    model = build_backbone(params, tiny_federation.num_features, tiny_federation.num_classes).to(device).eval()
    grads = []
    for graph in (dense_graph, sparse_graph):
        model.zero_grad()
        logits = model(graph)
        logits.square().sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        if graph is dense_graph:
            reference = logits.detach()
    assert torch.allclose(logits, reference, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(*grads))


def test_a_run_with_sparse_features_records_it_and_matches_the_dense_run(tiny_federation, device):
    from gflbench.experiments.runner import run
    from gflbench.experiments.spec import make_spec

    spec = make_spec("fedavg", "tiny", "metis", 5, 0, rounds=3)
    dense = run(spec, tiny_federation, device)
    sparse = run(spec, tiny_federation, device, sparse_features=True)
    assert (dense["features"], sparse["features"]) == ("dense", "sparse")
    assert sparse["curves"]["val"] == pytest.approx(dense["curves"]["val"], abs=1e-6)


def _star_graph(n: int) -> Data:
    """Node 0 joined to every other node: every pair of leaves is exactly two hops apart."""
    leaves = torch.arange(1, n)
    hub = torch.zeros(n - 1, dtype=torch.long)
    edge_index = torch.cat([torch.stack([hub, leaves]), torch.stack([leaves, hub])], dim=1)
    return Data(x=torch.randn(n, 5), edge_index=edge_index, num_nodes=n)


def test_a_2hop_operator_goes_dense_only_where_that_is_no_bigger():
    _, ring = h2gcn_adjacencies(_path_graph(30).edge_index, 30)  # 2 non-zeros per row of 30
    assert ring.layout == torch.sparse_csr
    _, leaves = h2gcn_adjacencies(_star_graph(12).edge_index, 12)  # 110 of 144 entries
    assert leaves.layout == torch.strided
    assert dense_if_no_larger(leaves.to_sparse_csr()).layout == torch.strided


def test_h2gcn_gives_the_same_representations_with_a_dense_or_sparse_2hop_operator():
    graph = _star_graph(12)
    H2GCN.prepare(graph)
    assert graph.hop2_adj.layout == torch.strided
    model = H2GCN(5, 8, 3, 0.0)
    dense = model.representations(graph).combined
    graph.hop2_adj = graph.hop2_adj.to_sparse_csr()
    torch.testing.assert_close(model.representations(graph).combined, dense)


@pytest.mark.parametrize("name", ["gcn", "masked_gcn", "sage", "h2gcn", "h2gcn-tanh"])
@pytest.mark.parametrize("training", [False, True])
def test_the_per_client_forward_is_the_one_client_case_of_the_stacked_network(name, training):
    """One network for both paths: a stacked backbone's `network` on stacks of two clients and their graphs
    packed together (the batched executor's `PackedPass`) gives each client what its own forward gives.
    Dropout is 0 so that training mode draws nothing; FED-PUB's masks are moved off one so that the
    masked weight (pruned in eval mode) matters."""
    import gflbench.baselines.fedpub  # noqa: F401  (registers masked_gcn)
    from gflbench.backbones import StackedBackbone
    from gflbench.core.batched import PackedPass

    torch.manual_seed(0)
    graphs = [_path_graph(6), _star_graph(5)]
    for graph in graphs:
        graph.x = torch.randn(graph.num_nodes, 6)
        BACKBONES[name].prepare(graph)
    models = [BACKBONES[name](6, 8, 3, 0.0).train(training) for _ in graphs]
    assert isinstance(models[0], StackedBackbone)
    with torch.no_grad():
        for model in models:
            for key, parameter in model.named_parameters():
                if key.endswith("mask"):
                    parameter.uniform_(-2e-3, 2.0)  # some entries below FED-PUB's pruning threshold
    stacks = {key: torch.stack([m.get_parameter(key) for m in models]) for key, _ in models[0].named_parameters()}
    logits, reps = models[0].network(stacks, PackedPass(graphs, training))
    for m, (model, graph) in enumerate(zip(models, graphs)):
        own_logits, own_reps = model.outputs(graph)
        torch.testing.assert_close(logits[m, : graph.num_nodes], own_logits)
        assert not logits[m, graph.num_nodes :].isnan().any()  # padding rows are finite filler
        if own_reps is not None:
            torch.testing.assert_close(reps.combined[m, : graph.num_nodes], own_reps.combined)
