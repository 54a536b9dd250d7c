"""FedGTA: label propagation, moments, smoothing confidence and acceptance-set mixing on hand-made
inputs; the GAMLP backbone's propagation and hop attention; runs through the real runner."""

from __future__ import annotations

import math

import pytest
import torch
from torch_geometric.data import Data

from gflbench.backbones import GAMLP, build_backbone
from gflbench.baselines.fedgta import (
    FedGTA,
    FedGTAClient,
    FedGTAParams,
    FedGTAServer,
    acceptance_sets,
    mixing_matrix,
    moment_vector,
    propagate_labels,
    seed_labels,
    smoothed_outputs,
    smoothing_confidence,
)  # fmt: skip
from gflbench.core.aggregation import mixtures, model_state, weighted_mean
from gflbench.core.method import Round, Setup, resolve_params
from gflbench.errors import UserError
from gflbench.experiments.presets import paper_preset
from gflbench.experiments.runner import DataCache, run
from gflbench.experiments.spec import make_spec

CPU = torch.device("cpu")


def _path4() -> Data:
    """0 - 1 - 2 - 3: degrees 1, 2, 2, 1 (sum 6); 3 classes; nodes 0 and 3 are training nodes."""
    src = torch.tensor([0, 1, 2])
    edge_index = torch.cat([torch.stack([src, src + 1]), torch.stack([src + 1, src])], dim=1)
    train = torch.tensor([True, False, False, True])
    return Data(x=torch.eye(4), y=torch.tensor([0, 1, 2, 2]), edge_index=edge_index, num_nodes=4,
                train_mask=train, val_mask=~train, test_mask=torch.zeros(4, dtype=torch.bool))  # fmt: skip


def _a_hat_path4() -> torch.Tensor:
    """D̃^-1/2 (A + I) D̃^-1/2 by hand: D̃ = (2, 3, 3, 2)."""
    d = torch.tensor([2.0, 3.0, 3.0, 2.0])
    a = torch.eye(4)
    for i in range(3):
        a[i, i + 1] = a[i + 1, i] = 1.0
    return a / torch.sqrt(d[:, None] * d[None, :])


# --- client statistics --------------------------------------------------------------------------------


def test_moments_of_a_one_hot_matrix_equal_the_hand_computed_ones():
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    # origin: a 0/1 entry is its own power, so every order is the class share (2/3, 1/3)
    torch.testing.assert_close(moment_vector(x, 3, "origin"), torch.tensor([2 / 3, 1 / 3] * 3, dtype=torch.float64))
    # central: deviations (1/3, -2/3, 1/3) and (-1/3, 2/3, -1/3); p=2: 6/27 = 2/9 each; p=3: -2/27 and +2/27
    central = torch.tensor([0, 0, 2 / 9, 2 / 9, -2 / 27, 2 / 27], dtype=torch.float64)
    torch.testing.assert_close(moment_vector(x, 3, "central"), central)
    hybrid = moment_vector(x, 3, "hybrid")
    assert hybrid.shape == (2 * 3 * 2,)
    torch.testing.assert_close(hybrid, torch.cat([torch.tensor([2 / 3, 1 / 3] * 3, dtype=torch.float64), central]))


def test_one_hot_soft_labels_give_confidence_c_over_e_times_the_degree_sum():
    degree = torch.tensor([1.0, 2.0, 2.0, 1.0])
    one_hot = torch.eye(3)[torch.tensor([0, 1, 2, 2])]
    assert smoothing_confidence(one_hot, degree).item() == pytest.approx(3 / math.e * 6, rel=1e-6)
    uniform = torch.full((4, 3), 1 / 3, dtype=torch.float64)  # the largest entropy, log 3, just below C/e = 1.1036
    assert smoothing_confidence(uniform, degree).item() == pytest.approx(6 * (3 / math.e - math.log(3)), rel=1e-5)
    isolated = torch.zeros(4)  # a client without edges has no smoothing confidence
    assert smoothing_confidence(uniform, isolated).item() == 0.0


def test_propagation_with_alpha_zero_returns_y0_and_reinforces_training_rows():
    adj = _a_hat_path4().to_sparse()
    y0 = torch.rand(4, 3, generator=torch.Generator().manual_seed(0))
    nobody = torch.zeros(4, dtype=torch.bool)
    torch.testing.assert_close(propagate_labels(adj, y0, nobody, alpha=0.0, steps=5), y0)
    train = torch.tensor([True, False, False, True])
    reinforced = propagate_labels(adj, y0, train, alpha=0.0, steps=5)
    torch.testing.assert_close(reinforced[~train], y0[~train])
    torch.testing.assert_close(reinforced[train], 2 * y0[train])  # Y⁰ added once more on training rows
    torch.testing.assert_close(propagate_labels(adj, y0, train, alpha=0.5, steps=0), y0)


def test_two_propagation_steps_by_hand():
    a_hat = _a_hat_path4()
    y0 = torch.eye(3)[torch.tensor([0, 1, 2, 2])]
    train = torch.tensor([True, False, False, True])
    r = y0 * train[:, None]
    y1 = 0.5 * a_hat @ y0 + 0.5 * y0 + r
    y2 = 0.5 * a_hat @ y1 + 0.5 * y0 + r
    torch.testing.assert_close(propagate_labels(a_hat.to_sparse(), y0, train, alpha=0.5, steps=2), y2)
    raw, distilled = smoothed_outputs(y2, y0, train, temperature=20.0)
    torch.testing.assert_close(raw[train], y0[train])  # training rows reset to their labels
    torch.testing.assert_close(raw[~train], y2[~train].softmax(dim=1))
    torch.testing.assert_close(distilled[~train], (y2[~train] / 20).softmax(dim=1))
    assert (distilled[~train].max(dim=1).values < raw[~train].max(dim=1).values).all()  # T flattens


def test_seed_labels_are_one_hot_on_training_rows_and_predictions_elsewhere():
    graph = _path4()
    soft = torch.full((4, 3), 1 / 3)
    y0 = seed_labels(soft, graph.y, graph.train_mask)
    assert y0[0].tolist() == [1, 0, 0] and y0[3].tolist() == [0, 0, 1]
    torch.testing.assert_close(y0[1:3], soft[1:3])


def _client(graph: Data, params: FedGTAParams) -> FedGTAClient:
    GAMLP.prepare(graph, params)
    setup = Setup(graph.num_features, 3, 1, 1, 1, CPU, 0)
    torch.manual_seed(0)
    return FedGTAClient(0, graph, build_backbone(params, graph.num_features, 3), params, setup)


def test_client_signature_on_a_four_node_graph():
    params = FedGTAParams(moments=3, moment_type="hybrid")
    graph = _path4()
    client = _client(graph, params)
    assert client.degree.tolist() == [1, 2, 2, 1]
    torch.testing.assert_close(client.adjacency.to_dense(), _a_hat_path4())
    moments, confidence = client.topology_signature()
    assert moments.shape == (2 * 3 * 3,) and moments.dtype == torch.float64
    assert 0 < confidence.item() < 3 / math.e * 6
    # a client whose every node is a training node: the smoothed labels are its one-hot labels
    labelled = _path4()
    labelled.train_mask = torch.ones(4, dtype=torch.bool)
    moments, confidence = _client(labelled, params).topology_signature()
    assert confidence.item() == pytest.approx(3 / math.e * 6)
    torch.testing.assert_close(moments[:3], torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64))  # μ_1: class shares


# --- server mixing ------------------------------------------------------------------------------------


def test_a_client_unlike_all_others_mixes_only_with_itself():
    moments = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.9, 0.1], [0.9, 1.0, 0.0], [0.0, 0.0, 1.0]])
    accept = acceptance_sets(moments, threshold=0.5)
    assert accept[3].tolist() == [False, False, False, True]
    assert accept[:3, :3].all() and accept.equal(accept.T)
    mix = mixing_matrix(accept, torch.tensor([1.0, 2.0, 3.0, 4.0]))
    torch.testing.assert_close(mix[0], torch.tensor([1 / 6, 2 / 6, 3 / 6, 0.0], dtype=torch.float64))
    assert mix[3].tolist() == [0.0, 0.0, 0.0, 1.0]
    # through the server: client 3's personalised model is exactly its own upload
    setup = Setup(5, 3, 4, 1, 1, CPU, 0)
    server = FedGTAServer(GAMLP(5, 8, 3, 0.0), FedGTAParams(), setup)
    states = []
    for seed in range(4):
        torch.manual_seed(seed)
        states.append(model_state(GAMLP(5, 8, 3, 0.0)))
    uploads = {
        cid: {"weights": states[cid], "moments": moments[cid], "confidence": torch.tensor(float(cid + 1))}
        for cid in range(4)
    }
    server.aggregate(Round(0), uploads)
    assert all(torch.equal(server.personalised[3][k], states[3][k]) for k in states[3])
    expected = weighted_mean(states[:3], torch.tensor([1.0, 2.0, 3.0]))
    for key, value in expected.items():
        torch.testing.assert_close(server.personalised[0][key], value)
    assert server.diagnostics()["accepted_share"] == pytest.approx(10 / 16)


def test_everyone_accepted_with_equal_confidence_is_fedavgs_uniform_mean():
    moments = torch.rand(5, 6, generator=torch.Generator().manual_seed(1))  # non-negative: every cosine > -1
    accept = acceptance_sets(moments, threshold=-1.0)
    assert accept.all()
    mix = mixing_matrix(accept, torch.full((5,), 2.5))
    states = []
    for seed in range(5):
        torch.manual_seed(seed)
        states.append(model_state(GAMLP(4, 6, 2, 0.0)))
    uniform = weighted_mean(states, torch.ones(5))
    for personalised in mixtures(states, mix):
        for key, value in uniform.items():
            torch.testing.assert_close(personalised[key], value)
    # no confidence anywhere (clients without edges): the plain mean of the accepted set, not 0/0
    torch.testing.assert_close(mixing_matrix(accept, torch.zeros(5)), torch.full((5, 5), 0.2, dtype=torch.float64))


# --- the GAMLP backbone -------------------------------------------------------------------------------


def test_gamlp_hops_are_powers_of_a_hat_and_the_cache_is_keyed_on_the_steps(tiny_federation):
    graph = _path4()
    graph.x = torch.rand(4, 5, generator=torch.Generator().manual_seed(2))
    GAMLP.prepare(graph, FedGTAParams(gamlp_steps=2))
    a_hat = _a_hat_path4()
    assert graph.gamlp_hops.shape == (4, 3, 5)  # [N, K+1, F]
    torch.testing.assert_close(graph.gamlp_hops[:, 0], graph.x)
    torch.testing.assert_close(graph.gamlp_hops[:, 2], a_hat @ a_hat @ graph.x)
    two = tiny_federation.on_device(FedGTAParams(gamlp_steps=2), CPU)[0]
    three = tiny_federation.on_device(FedGTAParams(), CPU)[0]
    assert two.gamlp_hops.shape[1] == 3 and three.gamlp_hops.shape[1] == 4
    torch.testing.assert_close(two.gamlp_hops, three.gamlp_hops[:, :3])


def test_gamlp_attention_is_per_node_over_its_own_hops():
    torch.manual_seed(0)
    model = GAMLP(5, 8, 3, 0.0, steps=3)
    hops = torch.randn(6, 4, 5)  # [N, K+1, F]
    alpha = model.hop_weights(hops)
    # the equation, one node and one hop at a time: σ(aᵀ[X⁽⁰⁾_v ∥ … ∥ X⁽³⁾_v ∥ X⁽ᵏ⁾_v] + b), softmax over k
    for v in range(6):
        every_hop = torch.cat([hops[v, k] for k in range(4)])
        scores = torch.stack([torch.sigmoid(model.hop_attention(torch.cat([every_hop, hops[v, k]]))) for k in range(4)])
        torch.testing.assert_close(alpha[v], scores.view(-1).softmax(dim=0))
    x_bar = sum(alpha[:, k : k + 1] * hops[:, k] for k in range(4))  # X̄_v = Σ_k α_k(v) X⁽ᵏ⁾_v, [N, F]
    h = model.act(model.layers[1](model.act(model.layers[0](x_bar))))  # two hidden layers (L = 3), dropout 0
    torch.testing.assert_close(model(Data(gamlp_hops=hops)), model.classifier(h))
    changed = hops.clone()
    changed[2] += 1.0
    moved = model.hop_weights(changed)
    assert not torch.allclose(moved[2], alpha[2])
    torch.testing.assert_close(moved[[0, 1, 3, 4, 5]], alpha[[0, 1, 3, 4, 5]])  # no other node's weights move
    # with no propagation the backbone is an MLP on X
    mlp = GAMLP(5, 8, 3, 0.0, steps=0).eval()
    graph = Data(gamlp_hops=hops[:, :1])
    h = hops[:, 0]
    for layer in mlp.layers:
        h = mlp.act(layer(h))
    torch.testing.assert_close(mlp(graph), mlp.classifier(h))
    assert set(GAMLP.options) == {"gamlp_steps", "gamlp_layers"} and GAMLP.head == "classifier"


# --- parameters and the runner ------------------------------------------------------------------------


def test_params_are_checked_and_the_paper_preset_is_the_official_config():
    with pytest.raises(UserError, match="moment_type"):
        resolve_params(FedGTA, {"moment_type": "raw"})
    with pytest.raises(UserError, match="out of range"):
        resolve_params(FedGTA, {"accept": "1"})
    official = {
        "hidden": "64",
        "lr": "0.01",
        "weight_decay": "0.0005",
        "dropout": "0.5",
        "local_epochs": "3",
        "rounds": "100",
    }
    assert paper_preset(FedGTA, "cora", "metis", 10) == {
        **official,
        "moment_type": "hybrid",
        "moments": "6",
        "accept": "0.5",
        "feature_norm": "none",  # the official loader reads Planetoid with no transform
    }
    assert paper_preset(FedGTA, "pubmed", "metis", 10)["moment_type"] == "origin"
    assert (
        paper_preset(FedGTA, "minesweeper", "metis", 10) == official
    )  # config.py sets moments for three datasets only
    assert paper_preset(FedGTA, "tiny", "metis", 5) == {}  # the synthetic test graph runs the Params defaults
    spec = make_spec("fedgta", "citeseer", "metis", 10, 0)
    assert (spec.params.moments, spec.params.hidden, spec.params.weight_decay, spec.local_epochs) == (20, 64, 5e-4, 3)


def _run(federation, scheme, clients, seed=0, rounds=4, **overrides):
    spec = make_spec("fedgta", "tiny", scheme, clients, seed, {k: str(v) for k, v in overrides.items()}, rounds=rounds)
    return run(spec, federation, CPU)


@pytest.mark.parametrize(("scheme", "clients"), [("metis", 5), ("overlap", 10)])
def test_runs_on_tiny_are_deterministic_and_personalised(scheme, clients):
    federation = DataCache(None, None).federated("tiny", scheme, clients, 1234)
    a = _run(federation, scheme, clients, seed=3)
    b = _run(federation, scheme, clients, seed=3)
    c = _run(federation, scheme, clients, seed=4)
    assert a["status"] == "ok" and a["val"] > 0.5
    assert a["curves"] == b["curves"] and a["diagnostics"] == b["diagnostics"]
    assert a["curves"] != c["curves"]
    assert all(1 / clients <= s <= 1 for s in a["diagnostics"]["accepted_share"])
    assert all(0 < w <= 1 for w in a["diagnostics"]["self_weight"])
    # a threshold nobody passes keeps every client on its own model
    alone = _run(federation, scheme, clients, seed=3, accept=0.999999)
    assert all(s == pytest.approx(1 / clients) for s in alone["diagnostics"]["accepted_share"])


def test_with_one_client_fedgta_is_local(cpu):
    single = DataCache(None, None).federated("tiny", "metis", 1, 1234)
    local = run(make_spec("local", "tiny", "metis", 1, 0, rounds=5), single, cpu)
    fedgta = run(make_spec("fedgta", "tiny", "metis", 1, 0, {"backbone": "gcn"}, rounds=5), single, cpu)
    assert local["curves"] == fedgta["curves"]  # its own confidence-weighted model comes back unchanged
