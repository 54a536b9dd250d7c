"""FedSSA (reimplementation): class-wise Gaussians, the semantic alignment loss, the server's distances,
clusters and cluster-level representatives, the spectral energy of a UniFilter filter, and the round
loop on `tiny` (METIS and overlapping), all on hand-made inputs or through the real runner."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from parties import build_parties

from gflbench.backbones import build_backbone
from gflbench.baselines.fedavg import FedAvg
from gflbench.baselines.fedssa import (
    FedSSA,
    FedSSAParams,
    class_gaussians,
    cluster_clients,
    cluster_distributions,
    energy_distances,
    energy_grams,
    gaussian_kl,
    normalized_laplacian,
    semantic_alignment_loss,
    semantic_distances,
    spectral_energy,
)
from gflbench.core.method import Round, Setup, resolve_params
from gflbench.errors import UserError
from gflbench.experiments.presets import paper_preset
from gflbench.experiments.runner import DataCache, run
from gflbench.experiments.spec import make_spec

# ------------------------------------------------------------------ semantic part


def test_class_gaussians_are_the_moments_of_each_class_mixture():
    # three nodes, two of class 0 and one of class 2 (class 1 absent), 2-d posteriors N(mu_v, diag var_v)
    mu = torch.tensor([[1.0, 0.0], [3.0, 2.0], [5.0, 5.0]])
    var = torch.tensor([[1.0, 2.0], [3.0, 4.0], [0.5, 0.5]])
    labels = torch.tensor([0, 0, 2])
    means, variances, counts = class_gaussians(mu, var, labels, 3, floor=0.0)
    assert counts.tolist() == [2.0, 0.0, 1.0]
    torch.testing.assert_close(means, torch.tensor([[2.0, 1.0], [0.0, 0.0], [5.0, 5.0]]))
    # class 0: mean of the variances (2, 3) plus the spread of the means around (2, 1): (1, 1)
    torch.testing.assert_close(variances, torch.tensor([[3.0, 4.0], [0.0, 0.0], [0.5, 0.5]]))
    floored = class_gaussians(mu, var, labels, 3, floor=0.25)[1]
    torch.testing.assert_close(floored, variances + 0.25)


def test_gaussian_kl_and_the_semantic_alignment_loss_on_a_tiny_example():
    # 1-d: KL(N(0, 1) || N(1, 2)) = ½(1/2 + 1/2 − 1 + ln 2) = ½ ln 2
    kl = gaussian_kl(torch.tensor([0.0]), torch.tensor([1.0]), torch.tensor([1.0]), torch.tensor([2.0]))
    assert kl.item() == pytest.approx(0.5 * math.log(2))
    # 2-d: mean over the dimensions, not the sum
    kl2 = gaussian_kl(torch.zeros(2), torch.ones(2), torch.tensor([1.0, 0.0]), torch.tensor([2.0, 1.0]))
    assert kl2.item() == pytest.approx(0.5 * (0.5 * math.log(2) + 0.0))
    means = torch.tensor([[0.0], [4.0], [7.0]])
    variances = torch.tensor([[1.0], [1.0], [1.0]])
    counts = torch.tensor([3.0, 2.0, 0.0])  # class 2 not held locally
    target_means = torch.tensor([[1.0], [9.0], [0.0]])
    target_variances = torch.tensor([[2.0], [1.0], [1.0]])
    present = torch.tensor([1.0, 0.0, 1.0])  # class 1 not represented by the cluster
    loss = semantic_alignment_loss(means, variances, counts, target_means, target_variances, present)
    assert loss.item() == pytest.approx(0.5 * math.log(2))  # only class 0 is held by both
    assert semantic_alignment_loss(means, variances, counts, means, variances, torch.ones(3)).item() == pytest.approx(
        0.0
    )
    none = semantic_alignment_loss(means, variances, counts, target_means, target_variances, torch.zeros(3))
    assert none.item() == 0.0


def _stats(clients: list[tuple[list[list[float]], list[list[float]], list[float]]]):
    means = torch.tensor([c[0] for c in clients])
    variances = torch.tensor([c[1] for c in clients])
    counts = torch.tensor([c[2] for c in clients])
    return means, variances, counts


def test_semantic_distances_are_symmetric_wasserstein_over_shared_classes():
    means, variances, counts = _stats([
        ([[0.0, 0.0], [1.0, 1.0]], [[1.0, 1.0], [1.0, 1.0]], [2.0, 3.0]),
        ([[0.0, 0.0], [1.0, 1.0]], [[1.0, 1.0], [1.0, 1.0]], [2.0, 3.0]),  # identical to client 0
        ([[2.0, 0.0], [9.0, 9.0]], [[4.0, 1.0], [1.0, 1.0]], [5.0, 0.0]),  # holds class 0 only
        ([[7.0, 7.0], [1.0, 3.0]], [[1.0, 1.0], [1.0, 1.0]], [0.0, 1.0]),  # holds class 1 only
    ])  # fmt: skip
    d = semantic_distances(means, variances, counts)
    assert torch.equal(d, d.T) and torch.equal(d.diagonal(), torch.zeros(4, dtype=d.dtype))
    assert d[0, 1] == 0.0
    # clients 0 and 2 share class 0: mean_d [(0−2)² + (1−2)²,  0 + 0] = (4 + 1) / 2; class 1 is not shared
    assert d[0, 2].item() == pytest.approx(2.5)
    assert d[0, 3].item() == pytest.approx((0.0 + 4.0) / 2)  # class 1 only: means (1,1) vs (1,3)
    assert d[2, 3].item() == pytest.approx(2 * 2.5)  # no class in common: twice the largest distance


def test_cluster_clients_groups_near_clients_and_an_identical_client_with_its_twin():
    points = torch.tensor([[0.0], [0.1], [0.1], [5.0], [5.2], [10.0]])
    d = torch.cdist(points, points)
    assert cluster_clients(d, 3).tolist() == [0, 0, 0, 1, 1, 2]
    assert cluster_clients(d, 1).tolist() == [0] * 6
    assert cluster_clients(d, 6).tolist() == list(range(6)) == cluster_clients(d, 9).tolist()
    labels = cluster_clients(d, 5)
    assert labels[1] == labels[2]  # clients 1 and 2 are identical: never separated
    assert len(labels.unique()) == 5
    nan = d.clone()
    nan[5, :] = nan[:, 5] = float("nan")  # a diverged client is put far from everyone, not a crash
    assert cluster_clients(nan, 2).tolist() == [0, 0, 0, 0, 0, 1]


def test_cluster_representatives_equal_the_pooled_class_gaussians():
    generator = torch.Generator().manual_seed(0)
    nodes = [torch.randn(n, 3, generator=generator) * 2 for n in (5, 7, 4)]
    node_vars = [torch.rand(n, 3, generator=generator) + 0.1 for n in (5, 7, 4)]
    node_labels = [torch.tensor([0, 0, 1, 1, 1]), torch.tensor([0, 1, 1, 1, 2, 2, 2]), torch.tensor([2, 2, 2, 2])]
    stats = [class_gaussians(m, v, y, 3, floor=0.0) for m, v, y in zip(nodes, node_vars, node_labels)]
    means, variances, counts = (torch.stack(parts) for parts in zip(*stats))
    labels = torch.tensor([0, 0, 1])  # clients 0 and 1 form a cluster; client 2 is alone
    target_means, target_variances, present = cluster_distributions(labels, means, variances, counts)
    pooled = class_gaussians(torch.cat(nodes[:2]), torch.cat(node_vars[:2]), torch.cat(node_labels[:2]), 3, floor=0.0)
    for client in (0, 1):
        torch.testing.assert_close(target_means[client], pooled[0])
        torch.testing.assert_close(target_variances[client], pooled[1])
        assert present[client].tolist() == [1.0, 1.0, 1.0]
    assert present[2].tolist() == [0.0, 0.0, 0.0]  # client 2 is alone: nobody to align with
    together = cluster_distributions(torch.tensor([0, 1, 1]), means, variances, counts)[2]
    assert together[1].tolist() == [1.0, 1.0, 1.0] and together[2].tolist() == [1.0, 1.0, 1.0]
    assert together[0].tolist() == [0.0, 0.0, 0.0]


# ------------------------------------------------------------------ structural part


def test_normalized_laplacian_of_a_path():
    edge_index = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    laplacian = normalized_laplacian(edge_index, 4).to_dense()  # node 3 isolated
    s = 1 / math.sqrt(2)
    expected = torch.tensor([[1, -s, 0, 0], [-s, 1, -s, 0], [0, -s, 1, 0], [0, 0, 0, 1]])
    torch.testing.assert_close(laplacian, expected)


def test_spectral_energy_on_a_hand_computed_case():
    # two nodes, one edge: L = [[1, −1], [−1, 1]], L² = 2L. Bases b₀ = (1, 0)ᵀ, b₁ = (1, 1)ᵀ, one feature.
    # Z = a b₀ + b b₁ = (a + b, b): ZᵀLZ = a², ZᵀL²Z = 2a², ZᵀZ = (a + b)² + b².
    laplacian = normalized_laplacian(torch.tensor([[0, 1], [1, 0]]), 2)
    bases = torch.tensor([[[1.0], [0.0]], [[1.0], [1.0]]])  # [K+1 = 2, N = 2, F = 1]
    grams = energy_grams(bases, laplacian, moments=2)
    assert grams.shape == (3, 1, 2, 2)
    for a, b in ((1.0, 1.0), (2.0, -1.0), (0.0, 3.0)):
        energy = spectral_energy(torch.tensor([[a], [b]]), grams)
        norm = (a + b) ** 2 + b**2
        torch.testing.assert_close(energy, torch.tensor([a**2 / norm, 2 * a**2 / norm]))
    # b₁ alone is the constant vector (frequency 0), b₀ alone splits its energy between λ = 0 and λ = 2
    assert spectral_energy(torch.tensor([[0.0], [1.0]]), grams).tolist() == [0.0, 0.0]
    assert spectral_energy(torch.tensor([[1.0], [0.0]]), grams).tolist() == [1.0, 2.0]


def test_spectral_energy_equals_the_rayleigh_quotients_of_the_filtered_signal():
    generator = torch.Generator().manual_seed(1)
    edge_index = torch.tensor([[0, 1, 1, 2, 2, 3, 3, 0, 0, 2], [1, 0, 2, 1, 3, 2, 0, 3, 2, 0]])
    bases = torch.randn(
        3, 5, 4, generator=generator, dtype=torch.float64
    )  # K+1 = 3 levels, 5 nodes (one isolated), F = 4
    weights = torch.randn(3, 4, generator=generator, dtype=torch.float64)
    laplacian = normalized_laplacian(edge_index, 5)
    grams = energy_grams(bases, laplacian.to(torch.float64), moments=3)
    z = (weights[:, None, :] * bases).sum(0)  # Z = Σ_k w_k ⊙ b_k
    dense = laplacian.to_dense().double()
    expected = (
        torch.stack([torch.trace(z.T @ torch.linalg.matrix_power(dense, p) @ z) for p in (1, 2, 3)]) / (z**2).sum()
    )
    torch.testing.assert_close(spectral_energy(weights, grams), expected)
    eigenvalues = torch.linalg.eigvalsh(dense)
    assert 0 <= expected[0] <= 2 and eigenvalues.min() > -1e-6 and eigenvalues.max() < 2 + 1e-6
    d = energy_distances(torch.tensor([[0.0, 1.0], [3.0, 5.0], [0.0, 1.0]]))
    torch.testing.assert_close(d, d.T)
    assert d[0, 1].item() == pytest.approx(25.0) and d[0, 2] == 0.0


# ------------------------------------------------------------------ server on hand-made uploads


def _server(num_clients: int, **overrides: str):
    params = resolve_params(FedSSA, {"levels": "1", "hidden": "4", "energy_moments": "2", **overrides})
    setup = Setup(
        num_features=3,
        num_classes=2,
        num_clients=num_clients,
        rounds=5,
        local_epochs=1,
        device=torch.device("cpu"),
        seed=0,
    )
    torch.manual_seed(0)
    return FedSSA.server(build_backbone(params, 3, 2), params, setup)


def _upload(server, shift: float, energy: list[float], scale: float = 1.0):
    weights = {k: v + shift for k, v in server.models[0].items()}
    return {
        "weights": weights,
        "num_train": torch.tensor(10),
        "means": torch.full((2, 4), scale),
        "variances": torch.ones(2, 4),
        "counts": torch.tensor([3.0, 4.0]),
        "energy": torch.tensor(energy),
    }


def test_server_clusters_twins_together_and_sends_them_the_same_model_and_targets():
    server = _server(5, structural_clusters="2", semantic_clusters="2")
    uploads = {
        0: _upload(server, 0.0, [0.1, 0.2], scale=0.0),
        1: _upload(server, 0.0, [0.1, 0.2], scale=0.0),  # identical to client 0
        2: _upload(server, 1.0, [0.12, 0.21], scale=0.1),
        3: _upload(server, 5.0, [1.5, 2.5], scale=9.0),
        4: _upload(server, 7.0, [1.6, 2.6], scale=9.5),
    }
    server.aggregate(Round(0), uploads)
    assert server.structural_labels.tolist() == [0, 0, 0, 1, 1]
    assert server.semantic_labels.tolist() == [0, 0, 0, 1, 1]
    sent = server.configure(Round(1), list(range(5)))
    key = next(iter(sent[0]["weights"]))
    initial = uploads[0]["weights"][key]
    for cid in (0, 1, 2):  # plain mean of shifts 0, 0, 1
        torch.testing.assert_close(sent[cid]["weights"][key], initial + 1 / 3)
    for cid in (3, 4):
        torch.testing.assert_close(sent[cid]["weights"][key], initial + 6.0)
    for name in ("target_means", "target_variances", "target_present"):
        assert torch.equal(sent[0][name], sent[1][name]) and torch.equal(sent[0][name], sent[2][name])
    torch.testing.assert_close(sent[0]["target_means"], torch.full((2, 4), 0.1 / 3))  # equal class counts: plain mean
    assert sent[3]["target_means"][0, 0].item() == pytest.approx(9.25)
    diagnostics = server.diagnostics()
    assert diagnostics["structural_clusters"] == diagnostics["semantic_clusters"] == 2.0
    assert diagnostics["energy"] == pytest.approx(0.684, abs=1e-6)  # mean E_1 over the clients
    assert diagnostics["class_variance"] == 1.0 and diagnostics["semantic_gap"] == 0.0  # no targets before
    server.aggregate(Round(1), uploads)  # same uploads: the clusters stay, the targets are met exactly ...
    assert server.diagnostics()["structural_changes"] == 0.0 and server.diagnostics()["semantic_changes"] == 0.0
    assert server.diagnostics()["semantic_gap"] > 0  # ... up to the spread between members


def test_without_semantic_weight_no_targets_are_sent():
    server = _server(2, semantic_weight="0")
    server.aggregate(Round(0), {0: _upload(server, 0.0, [0.1, 0.2]), 1: _upload(server, 1.0, [0.3, 0.2])})
    assert set(server.configure(Round(1), [0, 1])[0]) == {"weights"}


# ------------------------------------------------------------------ clients and the round loop


def test_with_alignment_off_one_cluster_and_a_shared_filter_fedssa_is_fedavg(tiny_federation, cpu):
    """Limiting case: no ELBO, no alignment terms, one structural cluster, the filter loaded like the rest
    and one learning rate: FedSSA's round is FedAvg's on the same UniFilter, bit for bit."""
    params = FedSSAParams(
        semantic_weight=0.0, structural_weight=0.0, elbo_weight=0.0, structural_clusters=1, share_filter=True,
        filter_lr=0.01, filter_weight_decay=5e-4, levels=2, hidden=16,
    )  # fmt: skip
    predictions = []
    for method in (FedSSA, FedAvg):
        server, clients = build_parties(method, params, tiny_federation, 4, cpu)
        torch.manual_seed(5)
        for index in range(4):
            downloads = server.configure(Round(index), list(range(len(clients))))
            uploads = {
                cid: client.fit(Round(index), copy.deepcopy(downloads[cid])) for cid, client in enumerate(clients)
            }
            server.aggregate(Round(index), uploads)
        predictions.append(torch.cat([client.predict() for client in clients]))
    assert torch.equal(predictions[0], predictions[1])


def test_filter_stays_local_and_is_pulled_towards_the_cluster_filters_energy(tiny_federation, cpu):
    params = FedSSAParams(
        levels=2, hidden=16, structural_clusters=1, semantic_weight=0.0, elbo_weight=0.0, structural_weight=1e4
    )
    server, clients = build_parties(FedSSA, params, tiny_federation, 3, cpu)
    for index in range(3):
        downloads = server.configure(Round(index), list(range(len(clients))))
        uploads = {cid: client.fit(Round(index), copy.deepcopy(downloads[cid])) for cid, client in enumerate(clients)}
        server.aggregate(Round(index), uploads)
    filters = [client.model.level_weights.detach() for client in clients]
    assert not torch.equal(filters[0], filters[1])  # personal filters
    message = server.configure(Round(3), [0])[0]
    sent = message["weights"]
    client = clients[0]
    before = client.model.level_weights.detach().clone()
    client.receive(Round(3), copy.deepcopy(message))
    assert torch.equal(client.model.level_weights.detach(), before)  # the cluster filter is not loaded ...
    mlp = next(k for k in sent if k != client.filter_key)
    assert torch.equal(client.model.state_dict()[mlp], sent[mlp])  # ... the rest is
    target = spectral_energy(sent[client.filter_key], client.grams)
    torch.testing.assert_close(client.energy_target, target)
    target = client.energy_target = target + 0.02  # a target the local filter is visibly away from
    gap = ((spectral_energy(client.model.level_weights, client.grams) - target) ** 2).sum()
    for _ in range(5):
        client.train_local()
    after = ((spectral_energy(client.model.level_weights, client.grams) - target) ** 2).sum()
    assert after < gap  # λ_str pulls the local filter's energy moments towards the cluster filter's


def test_uploads_are_the_eval_mode_statistics_of_the_training_nodes(tiny_federation, cpu):
    server, (client, *_) = build_parties(FedSSA, FedSSAParams(levels=2, hidden=16), tiny_federation, 2, cpu)
    upload = client.fit(Round(0), copy.deepcopy(server.configure(Round(0), [0])[0]))
    assert set(upload) == {"weights", "num_train", "means", "variances", "counts", "energy"}
    labels = client.graph.y[client.graph.train_mask]
    assert upload["counts"].tolist() == torch.bincount(labels, minlength=tiny_federation.num_classes).float().tolist()
    client.model.eval()
    with torch.no_grad():
        h = client.model.embed(client.graph)[client.graph.train_mask]
    present = upload["counts"] > 0
    by_class = torch.stack([h[labels == c].mean(0) for c in present.nonzero().view(-1)])
    torch.testing.assert_close(upload["means"][present], by_class)
    assert (upload["variances"] > 0).all() and upload["energy"].shape == (3,)
    assert 0 <= upload["energy"][0] <= 2


def _run(federation, cpu, scheme="metis", clients=5, seed=0, rounds=4, **overrides):
    spec = make_spec("fedssa", "tiny", scheme, clients, seed, {k: str(v) for k, v in overrides.items()}, rounds=rounds)
    return run(spec, federation, cpu)


SMALL = {"levels": 3, "hidden": 32}


def test_runs_on_tiny_metis_are_deterministic_and_learn(tiny_federation, cpu):
    a = _run(tiny_federation, cpu, seed=3, rounds=6, **SMALL)
    b = _run(tiny_federation, cpu, seed=3, rounds=6, **SMALL)
    c = _run(tiny_federation, cpu, seed=4, rounds=6, **SMALL)
    assert a["curves"] == b["curves"] and a["diagnostics"] == b["diagnostics"]
    assert a["curves"] != c["curves"]
    assert a["val"] > 0.6  # tiny is easy; the majority class is about 0.35
    assert a["diagnostics"]["structural_clusters"] == [3.0] * 6 == a["diagnostics"]["semantic_clusters"]
    assert all(b > 0 for b in a["bytes_up"]) and a["bytes_down"][1] > a["bytes_down"][0]  # targets from round 1


def test_runs_on_tiny_overlapping_partitions(cpu):
    federation = DataCache(None, None).federated("tiny", "overlap", 10, 1234)
    record = _run(federation, cpu, scheme="overlap", clients=10, rounds=3, **SMALL)
    assert record["status"] == "ok" and record["val"] > 0.5
    assert record["diagnostics"]["structural_clusters"] == [3.0] * 3


def test_params_are_checked():
    with pytest.raises(UserError):
        FedSSAParams(backbone="gcn")
    with pytest.raises(UserError):
        FedSSAParams(semantic_clusters=0)
    with pytest.raises(UserError):
        resolve_params(FedSSA, {"semantic_weight": "-1"})
    assert FedSSA.title.endswith("(reimpl.)")
    preset = paper_preset(FedSSA, "cora", "metis", 10)
    assert resolve_params(FedSSA, preset).levels == 7 and "lr" not in preset
    assert "backbone" not in preset  # FedICI's values, not its code reading of the bases (tests/test_presets.py)
    assert paper_preset(FedSSA, "tiny", "metis", 5) == {}
