"""FedTAD: reliabilities from topology embeddings, the generator and its pseudo graph, the distillation
step, and whole runs on `tiny` (both partitions); checked on hand-made inputs and through the runner."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from parties import build_parties
from torch.nn import functional as F
from torch_geometric.data import Data

from gflbench.baselines.fedtad import (
    FedTAD,
    FedTADParams,
    PseudoGraphGenerator,
    class_reliability,
    diversity_loss,
    knn_edges,
    landing_probabilities,
    node_weights,
    normalise_reliability,
    pseudo_labels,
    walk_embedding,
    weighted_cross_entropy,
    weighted_l1_gap,
)
from gflbench.core.aggregation import model_state
from gflbench.core.method import Round, resolve_params
from gflbench.errors import UserError
from gflbench.experiments.runner import DataCache, run
from gflbench.experiments.spec import make_spec


def _undirected(pairs: list[tuple[int, int]]) -> torch.Tensor:
    edges = torch.tensor(pairs).T
    return torch.cat([edges, edges.flip(0)], dim=1)


PATH = _undirected([(0, 1), (1, 2)])  # 0 - 1 - 2
HOUSE = _undirected([(0, 1), (1, 2), (2, 3), (3, 0), (0, 4), (1, 4)])  # a square with a roof


# ---- reliability ---------------------------------------------------------------------------------------


def test_reliability_is_shared_out_over_clients_per_class():
    ckr = torch.tensor([[2.0, 1.0, 0.0], [6.0, 3.0, 0.0], [0.0, 0.0, 0.0]])  # 3 clients, class 2 seen by none
    by_clients = normalise_reliability(ckr, "clients")
    torch.testing.assert_close(by_clients, torch.tensor([[0.25, 0.25, 0.0], [0.75, 0.75, 0.0], [0.0, 0.0, 0.0]]))
    by_classes = normalise_reliability(ckr, "classes")  # OpenFGL: within each client
    torch.testing.assert_close(by_classes, torch.tensor([[2 / 3, 1 / 3, 0.0], [2 / 3, 1 / 3, 0.0], [0.0, 0.0, 0.0]]))
    assert not by_clients.isnan().any() and not by_classes.isnan().any()  # empty classes and clients give 0


def test_landing_probabilities_are_the_diagonals_of_walk_matrix_powers():
    t = landing_probabilities(PATH, 3, 2)
    # T = (A+I) D⁻¹ with degrees 2, 3, 2: T_00 = 1/2; (T²)_00 = T_00 T_00 + T_01 T_10 = 1/4 + 1/6
    torch.testing.assert_close(t[0], torch.tensor([1 / 2, 5 / 12]))
    torch.testing.assert_close(t[1], torch.tensor([1 / 3, 1 / 9 + 2 * (1 / 3) * (1 / 2)]))
    a = torch.eye(5)
    a[HOUSE[0], HOUSE[1]] = 1.0
    walk = (a / a.sum(dim=0, keepdim=True)).double()  # (A+I) D⁻¹, column-stochastic
    expected = torch.stack([torch.linalg.matrix_power(walk, i).diagonal() for i in range(1, 6)], dim=1)
    torch.testing.assert_close(landing_probabilities(HOUSE, 5, 5), expected.float())
    rows = torch.tensor([4, 1])
    torch.testing.assert_close(landing_probabilities(HOUSE, 5, 5, rows), expected[rows].float())


def test_walk_embeddings_follow_the_graph_or_jump_like_the_official_code():
    n, steps = 5, 4
    walks = walk_embedding(HOUSE, n, steps, torch.Generator().manual_seed(0), elementwise=False).long()
    assert walks.shape == (n, steps * (steps + 1) // 2)  # lengths 1..k, k(k+1)/2 columns
    starts = [0] + [sum(range(1, i + 1)) for i in range(1, steps)]  # first column of each length
    for column in starts:
        assert torch.equal(walks[:, column], torch.arange(n))  # every walk starts at its node
    closed = {(int(u), int(v)) for u, v in HOUSE.T} | {(v, v) for v in range(n)}
    for length in range(2, steps + 1):  # every step stays in the closed neighbourhood (row of D⁻¹(A+I))
        block = walks[:, starts[length - 1] : starts[length - 1] + length]
        assert all((int(a), int(b)) in closed for a, b in zip(block[:, :-1].flatten(), block[:, 1:].flatten()))
    again = walk_embedding(HOUSE, n, steps, torch.Generator().manual_seed(0), elementwise=False)
    assert torch.equal(walks.float(), again)  # seeded

    # the code's T = A * pinverse(D) keeps only the diagonal, and the softmax over a row of 60 nodes
    # makes a step stay with probability e^(1/d)/(e^(1/d) + 59) and jump uniformly otherwise
    ring = _undirected([(i, (i + 1) % 60) for i in range(60)])
    jumps = walk_embedding(ring, 60, 5, torch.Generator().manual_seed(0), elementwise=True).long()
    step_from, step_to = jumps[:, 10:14].flatten(), jumps[:, 11:15].flatten()  # the length-5 walks
    far = ((step_from - step_to).abs() % 59 > 1).float().mean()
    assert far > 0.9  # almost every step lands on a non-neighbour


def test_class_reliability_by_hand():
    # path 0 - 1 - 2; node 0 (class 0) and node 2 (class 1) are training nodes, node 1 is not
    x = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    topology = torch.zeros(3, 1)
    graph = Data(
        x=x, edge_index=PATH, y=torch.tensor([0, 1, 1]), train_mask=torch.tensor([True, False, True]), num_nodes=3
    )
    ckr = class_reliability(graph, topology, num_classes=3)
    cos = 1 / math.sqrt(2)  # cos([1,0],[1,1]) = cos([0,1],[1,1])
    torch.testing.assert_close(ckr, torch.tensor([(1 + cos) / 2, (1 + cos) / 2, 0.0]))
    # the topology part enters the cosine: t_0 = t_1 = 1 and t_2 = 0
    ckr = class_reliability(graph, torch.tensor([[1.0], [1.0], [0.0]]), num_classes=3)
    torch.testing.assert_close(ckr[0], torch.tensor((1 + 2 / (math.sqrt(2) * math.sqrt(3))) / 2))
    torch.testing.assert_close(ckr[1], torch.tensor((1 + 1 / math.sqrt(3)) / 2))


# ---- generator, pseudo graph, losses -------------------------------------------------------------------


def test_generator_output_and_pseudo_graph_shapes():
    torch.manual_seed(0)
    labels = pseudo_labels(10, 3)
    assert labels.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 2]  # ⌊n/C⌋ each, the rest to the last class
    generator = PseudoGraphGenerator(noise_dim=32, num_classes=3, out_dim=17, dropout=0.0)
    x = generator(torch.randn(10, 32), labels)
    assert x.shape == (10, 17) and x.requires_grad
    edges = knn_edges(x, k=4)
    assert edges.shape[0] == 2 and not (edges[0] == edges[1]).any()  # self-loops are the backbone's job
    pairs = {(int(a), int(b)) for a, b in edges.T}
    assert pairs == {(b, a) for a, b in pairs}  # symmetric
    assert torch.bincount(edges[0], minlength=10).min() >= 3  # each node's top-4 contains itself


def test_pseudo_graph_connects_cosine_neighbours_only():
    points = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.8, 0.2], [0.0, 1.0], [0.1, 0.9], [0.2, 0.8]])
    edges = knn_edges(points, k=3)  # each point, with itself, has its own cluster as top 3
    assert ((edges[0] < 3) == (edges[1] < 3)).all()
    assert edges.shape[1] == 12  # both clusters complete (3 undirected edges each, both directions)


def test_per_node_weights_reproduce_the_official_per_class_loops():
    torch.manual_seed(0)
    m, n, c = 3, 11, 4
    labels = pseudo_labels(n, c)
    reliability = normalise_reliability(torch.rand(m, c), "clients")
    teachers, student = torch.randn(m, n, c), torch.randn(n, c)
    weights = node_weights(reliability, labels)
    semantic = divergence = 0.0
    for i in range(m):  # official train_fedtad.py: a sum over clients and classes of class means
        for k in range(c):
            rows = labels == k
            semantic += reliability[i, k] * F.cross_entropy(teachers[i][rows], labels[rows])
            divergence += reliability[i, k] * (student[rows] - teachers[i][rows]).abs().mean(dim=1).mean()
    torch.testing.assert_close(weighted_cross_entropy(teachers, labels, weights), semantic)
    torch.testing.assert_close(weighted_l1_gap(student, teachers, weights), divergence)


def test_diversity_loss_matches_the_broadcast_formula_and_its_gradient():
    torch.manual_seed(0)
    z, x = torch.randn(9, 5), torch.randn(9, 7, requires_grad=True)
    noise = (z.unsqueeze(0) - z.unsqueeze(1)).pow(2).mean(dim=-1)  # official pairwise_distance, l2
    layer = (x.unsqueeze(0) - x.unsqueeze(1)).abs().mean(dim=-1)  # l1
    reference = torch.exp(torch.mean(-noise * layer))
    (expected,) = torch.autograd.grad(reference, x)
    value = diversity_loss(z, x)
    (gradient,) = torch.autograd.grad(value, x)
    torch.testing.assert_close(value, reference)
    torch.testing.assert_close(gradient, expected)


# ---- server steps --------------------------------------------------------------------------------------


def _server_with_uploads(tiny_federation, cpu, **overrides):
    params = resolve_params(FedTAD, {k: str(v) for k, v in overrides.items()})
    server, clients = build_parties(FedTAD, params, tiny_federation, 3, cpu)
    sent = server.configure(Round(0), [c.cid for c in clients])
    uploads = {c.cid: c.fit(Round(0), copy.deepcopy(sent[c.cid])) for c in clients}
    return server, clients, uploads


def test_the_distillation_step_lowers_the_l1_gap_on_a_fixed_batch(tiny_federation, cpu):
    server, _, uploads = _server_with_uploads(tiny_federation, cpu, dropout=0.0, it_d=20, distill_lr=0.01)
    server.average(uploads)
    teachers, weights = server.teachers_and_weights(uploads)
    assert weights.shape == (5, server.params.num_gen)
    torch.testing.assert_close(
        weights.sum(), torch.tensor(float(len(set(server.labels.tolist()))))
    )  # Σ_i ĉ = 1 per class
    z = torch.randn(server.params.num_gen, server.params.noise_dim, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        graph = server.pseudo_graph(server.generator(z, server.labels))
        local = torch.stack([t(graph) for t in teachers])
        before = weighted_l1_gap(server.model(graph), local, weights)
    teachers_before = [copy.deepcopy(model_state(t)) for t in teachers]
    server.train_global(z, teachers, weights)
    with torch.no_grad():
        after = weighted_l1_gap(server.model(graph), local, weights)
    assert after < 0.9 * before  # the teachers disagree, so the smallest reachable gap is above zero
    for teacher, state in zip(teachers, teachers_before):  # the client models are not trained
        assert all(torch.equal(v, state[k]) for k, v in model_state(teacher).items())


def test_the_generator_step_moves_only_the_generator(tiny_federation, cpu):
    server, _, uploads = _server_with_uploads(tiny_federation, cpu)
    server.average(uploads)
    teachers, weights = server.teachers_and_weights(uploads)
    student = copy.deepcopy(model_state(server.model))
    generator = copy.deepcopy(server.generator.state_dict())
    z = torch.randn(server.params.num_gen, server.params.noise_dim, generator=torch.Generator().manual_seed(0))
    loss = server.train_generator(z, teachers, weights)
    assert math.isfinite(loss)
    assert all(torch.equal(v, student[k]) for k, v in model_state(server.model).items())
    assert all(p.grad is None for p in server.model.parameters())
    assert any(not torch.equal(v, generator[k]) for k, v in server.generator.state_dict().items())


def test_clients_upload_tensors_and_their_reliability_once_computed(tiny_federation, cpu):
    _server, clients, uploads = _server_with_uploads(tiny_federation, cpu)
    for client, upload in zip(clients, uploads.values()):
        assert set(upload) == {"weights", "num_train", "num_nodes", "reliability"}
        assert upload["reliability"].shape == (tiny_federation.num_classes,)
        assert int(upload["num_nodes"]) == client.graph.num_nodes
        assert (upload["reliability"] >= 0).all() and upload["reliability"].sum() > 0
        assert upload["reliability"] is client.reliability  # the cached value, not recomputed


# ---- whole runs ----------------------------------------------------------------------------------------


def _run(federation, cpu, scheme="metis", clients=5, seed=0, rounds=4, method="fedtad", **overrides):
    spec = make_spec(method, "tiny", scheme, clients, seed, {k: str(v) for k, v in overrides.items()}, rounds=rounds)
    return run(spec, federation, cpu)


def test_runs_on_tiny_are_deterministic_and_record_the_distillation(tiny_federation, cpu):
    a = _run(tiny_federation, cpu, seed=1)
    b = _run(tiny_federation, cpu, seed=1)
    c = _run(tiny_federation, cpu, seed=2)
    assert a["status"] == "ok" and a["curves"] == b["curves"] and a["diagnostics"] == b["diagnostics"]
    assert a["curves"] != c["curves"]
    assert set(a["diagnostics"]) == {"generator_loss", "distill_gap", "pseudo_row_l1"}
    assert all(math.isfinite(v) for values in a["diagnostics"].values() for v in values)
    assert a["test"] > 0.5  # 4 classes: well above chance after four rounds
    code = _run(tiny_federation, cpu, seed=1, topology="code")  # the official embedding changes the weights
    assert code["curves"] != a["curves"]


def test_overlapping_partition_runs(cpu):
    overlap = DataCache(None, None).federated("tiny", "overlap", 10, 1234)
    record = _run(overlap, cpu, scheme="overlap", clients=10, rounds=3, topology="walk", ckr_norm="classes")
    assert record["status"] == "ok" and len(record["client_curves"]["test"][0]) == 10
    assert all(math.isfinite(v) for v in record["curves"]["test"])


def test_without_server_epochs_fedtad_is_fedavg(tiny_federation, cpu):
    fedavg = _run(tiny_federation, cpu, method="fedavg", rounds=5)
    fedtad = _run(tiny_federation, cpu, rounds=5, glb_epochs=0, weighting="uniform")
    assert fedtad["curves"] == fedavg["curves"]  # the server's own RNG draws leave the clients' stream alone
    params = resolve_params(FedTAD, {"glb_epochs": "0", "weighting": "uniform"})
    fedavg_params = {
        "backbone": "gcn",
        "hidden": 128,
        "lr": 0.01,
        "weight_decay": 1e-6,
        "dropout": 0.5,
        "weighting": "uniform",
    }
    assert FedTAD.equivalent(params, "metis", 1) == ("fedavg", fedavg_params)
    assert FedTAD.equivalent(resolve_params(FedTAD, {}), "metis", 1) is None


@pytest.mark.parametrize(
    "overrides",
    [{"topology": "random"}, {"ckr_norm": "global"}, {"weighting": "edges"}, {"topk": 200}, {"backbone": "mlp"}],
)
def test_impossible_params_are_user_errors(overrides):
    with pytest.raises(UserError):
        FedTADParams(**overrides)


def test_the_paper_preset_is_the_official_training_configuration():
    """`paper` runs FedTAD as its official script trains (train_fedtad.py: hidden 64, lr 0.01, weight decay
    5e-4, dropout 0.5, 3 local epochs, 100 rounds); the Params defaults stay the shared protocol values."""
    spec = make_spec("fedtad", "cora", "metis", 10, 0)
    params = spec.params
    assert (params.hidden, params.lr, params.weight_decay, params.dropout) == (64, 0.01, 5e-4, 0.5)
    assert (spec.local_epochs, spec.rounds) == (3, 100)
    computer = make_spec("fedtad", "amazon-computer", "overlap", 30, 0)
    assert (computer.rounds, computer.local_epochs) == (100, 3)  # the script's 100 rounds, not the protocol's 200
    assert (FedTADParams().hidden, FedTADParams().weight_decay) == (128, 1e-6)
    # the command line wins; with the shared values spelt out, the configuration is the one `paper` had before
    before = make_spec("fedtad", "cora", "metis", 10, 0, {"hidden": "128", "weight_decay": "1e-6"}, local_epochs=1)
    assert before.params == FedTADParams() and before.local_epochs == 1
