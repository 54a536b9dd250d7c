"""UniFilter's bases and filter, and FedICI's client graphs: hand-made inputs, limiting cases, runs on `tiny`."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from parties import build_parties
from torch_geometric.data import Data

from gflbench.backbones import (
    BACKBONES,
    UniFilter,
    train_homophily,
    unibasis,
    unifilter_adjacency,
    unifilter_components,
)
from gflbench.baselines.fedici import (
    FedICI,
    FedICIParams,
    affinities,
    client_subspaces,
    greedy_subspace_cosines,
    initial_client_graph,
    learn_client_graph,
    one_newton_threshold,
    personalised_states,
    principal_directions,
    simplex_projection,
    subspace_cosines,
)  # fmt: skip
from gflbench.core.aggregation import weighted_mean
from gflbench.core.method import Round
from gflbench.errors import UserError
from gflbench.experiments.presets import paper_preset
from gflbench.experiments.runner import DataCache, run
from gflbench.experiments.spec import make_spec

SQRT_HALF = 1 / math.sqrt(2)


def _path(n: int) -> torch.Tensor:
    src = torch.arange(n - 1)
    return torch.cat([torch.stack([src, src + 1]), torch.stack([src + 1, src])], dim=1)


# --- UniFilter ---------------------------------------------------------------------------------------


def test_adjacency_is_symmetric_normalised_without_self_loops():
    edge_index = torch.tensor([[0, 1, 1, 1], [1, 2, 1, 0]])  # 0-1 both ways, 1→2 one way, a self-loop on 1
    adj = unifilter_adjacency(edge_index, 4).to_dense()
    expected = torch.zeros(4, 4, dtype=torch.float64)
    expected[0, 1] = expected[1, 0] = expected[1, 2] = expected[2, 1] = SQRT_HALF  # degrees 1, 2, 1, 0
    torch.testing.assert_close(adj, expected)


def test_tau_one_gives_powers_of_the_adjacency():
    torch.manual_seed(0)
    edge_index = torch.tensor([[0, 0, 1, 2, 3], [1, 2, 2, 3, 4]])
    adj = unifilter_adjacency(edge_index, 5)
    x = torch.rand(5, 3, dtype=torch.float64)
    u, g = unifilter_components(adj, x, 3, homophily=0.3)
    bases = unibasis(x, u, g, tau=1.0)
    dense = adj.to_dense()
    for k in range(4):
        torch.testing.assert_close(bases[k], torch.linalg.matrix_power(dense, k) @ x)


def test_heterophily_bases_on_a_path_by_hand():
    # path 0-1-2, x = e_0, ĥ = 1/2: θ = π/4. v0 = e_0, v1 = e_1 (Â e_0 = e_1/√2), v2 = e_2.
    adj = unifilter_adjacency(_path(3), 3)
    x = torch.tensor([[1.0], [0.0], [0.0]], dtype=torch.float64)
    u, g = unifilter_components(adj, x, 2, homophily=0.5)
    torch.testing.assert_close(
        g[0, :, 0], torch.tensor([SQRT_HALF, SQRT_HALF, 0.0], dtype=torch.float64)
    )  # (v0 + tan θ v1)/‖·‖
    c = SQRT_HALF
    t2 = math.sqrt(((1 + c) / (2 * c)) ** 2 - (1 + c) / 2)  # ⟨s2, g1⟩ = 1 + c, s2 = g0 + g1
    g2 = torch.tensor([(1 + c) / 2, c / 2, t2], dtype=torch.float64)
    torch.testing.assert_close(g[1, :, 0], g2 / g2.norm())
    torch.testing.assert_close(u[0, :, 0], torch.tensor([0.0, SQRT_HALF, 0.0], dtype=torch.float64))  # Â x
    mixed = unibasis(x, u, g, tau=0.5)
    torch.testing.assert_close(mixed[1, :, 0], torch.tensor([c / 2, c, 0.0], dtype=torch.float64))  # ½Âx + ½g1


@pytest.mark.parametrize("homophily", [0.1, 0.5, 0.9])
def test_every_heterophily_basis_makes_angle_theta_with_the_others(homophily):
    torch.manual_seed(1)
    edge_index = torch.randint(0, 40, (2, 120))
    x = torch.rand(40, 4, dtype=torch.float64)
    _, g = unifilter_components(unifilter_adjacency(edge_index, 40), x, 5, homophily)
    bases = torch.cat([(x / x.norm(dim=0)).unsqueeze(0), g])  # g0 = x/‖x‖, then g1..g5
    gram = torch.einsum("knf,lnf->fkl", bases, bases)  # [F, 6, 6]
    off_diagonal = gram[:, ~torch.eye(6, dtype=torch.bool)]
    torch.testing.assert_close(gram.diagonal(dim1=1, dim2=2), torch.ones(4, 6, dtype=torch.float64))
    torch.testing.assert_close(off_diagonal, torch.full_like(off_diagonal, math.cos(math.pi * (1 - homophily) / 2)))


def test_code_rule_takes_t1_from_the_raw_features():
    # official: t1 = sqrt((⟨g0, x⟩ / cos θ)² − 1) with x unnormalised; x = 2 e_0 gives ⟨g0, x⟩ = 2
    adj = unifilter_adjacency(_path(3), 3)
    x = torch.tensor([[2.0], [0.0], [0.0]], dtype=torch.float64)
    c = math.cos(math.pi / 4)
    _, g = unifilter_components(adj, x, 1, homophily=0.5, rule="code")
    t1 = math.sqrt((2 / c) ** 2 - 1)
    expected = torch.tensor([1.0, t1, 0.0], dtype=torch.float64)
    torch.testing.assert_close(g[0, :, 0], expected / expected.norm())
    _, paper = unifilter_components(adj, x, 1, homophily=0.5)
    assert not torch.allclose(paper, g)


def test_homophily_ratio_reads_training_labels_only():
    # path 0-1-2-3-4; train = {0, 1, 2, 4}: train-train edges 0-1, 1-2 (both directions)
    edge_index = _path(5)
    train = torch.tensor([True, True, True, False, True])
    y = torch.tensor([0, 0, 1, 1, 1])
    assert train_homophily(edge_index, y, train) == pytest.approx(0.5)  # 0-1 same, 1-2 different
    y_other = y.clone()
    y_other[3] = 7  # a non-training label
    assert train_homophily(edge_index, y_other, train) == pytest.approx(0.5)
    assert train_homophily(edge_index, y, torch.tensor([True, False, True, False, True])) == 0.75  # no edge: 0.75
    # FedGSP's homocal: sources are ids 0..n_train-1 = {0, 1, 2, 3}, ends training nodes:
    # 0→1 same, 1→0 same, 1→2 diff, 2→1 diff, 3→2 same, 3→4 same
    assert train_homophily(edge_index, y, train, rule="code") == pytest.approx(4 / 6)


def test_filter_and_head():
    graph = Data(
        x=torch.rand(4, 3),
        edge_index=_path(4),
        y=torch.tensor([0, 1, 0, 1]),
        train_mask=torch.ones(4, dtype=torch.bool),
    )
    params = FedICIParams(levels=2, tau=0.5, hidden=8, mlp_layers=3)
    UniFilter.prepare(graph, params)
    assert graph.unifilter_bases.shape == (3, 4, 3) and graph.unifilter_bases.dtype == torch.float32
    assert graph.unifilter_homophily.item() == 0.0  # neighbours always differ
    model = UniFilter.from_params(3, 2, params).eval()
    assert model.level_weights.shape == (3, 3)
    torch.testing.assert_close(model.level_weights, torch.full((3, 3), 1 / 3))  # official init 1/(K+1)
    with torch.no_grad():
        model.level_weights.copy_(torch.tensor([[1.0, 0.0, 2.0], [0.5, 0.5, 0.5], [0.0, -1.0, 1.0]]))
    bases = graph.unifilter_bases
    expected = bases[0] * model.level_weights[0] + bases[1] * model.level_weights[1] + bases[2] * model.level_weights[2]
    torch.testing.assert_close(model.filtered(graph), expected)
    h = torch.relu(model.layers[0](expected))
    h = torch.relu(model.layers[1](h) + h)  # hidden → hidden: the official residual
    torch.testing.assert_close(model(graph), model.classifier(h))
    assert UniFilter.head == "classifier" and UniFilter.options == ("levels", "tau")
    assert BACKBONES["unifilter"] is UniFilter and issubclass(BACKBONES["unifilter-code"], UniFilter)


def test_prepared_bases_follow_the_options(tiny_federation, cpu):
    a = tiny_federation.on_device(FedICIParams(levels=2, tau=0.5), cpu)[0]
    b = tiny_federation.on_device(FedICIParams(levels=2, tau=1.0), cpu)[0]
    c = tiny_federation.on_device(FedICIParams(levels=3, tau=1.0), cpu)[0]
    assert a.unifilter_bases.shape[0] == 3 and c.unifilter_bases.shape[0] == 4
    assert not torch.equal(a.unifilter_bases[1], b.unifilter_bases[1])
    torch.testing.assert_close(b.unifilter_bases, c.unifilter_bases[:3])


# --- FedICI: client subspaces ------------------------------------------------------------------------


def test_principal_directions_match_the_exact_pca():
    torch.manual_seed(2)
    x = torch.randn(60, 5, dtype=torch.float64) @ torch.randn(5, 40, dtype=torch.float64) + 0.01 * torch.randn(
        60, 40, dtype=torch.float64
    )
    fast = principal_directions(x, 3, torch.Generator().manual_seed(0))
    exact = torch.linalg.svd(x - x.mean(0), full_matrices=False).Vh[:3]
    torch.testing.assert_close(fast.abs(), exact.abs(), atol=1e-8, rtol=0)  # same directions, signs aside
    torch.testing.assert_close(fast @ fast.T, torch.eye(3, dtype=torch.float64))
    small = principal_directions(
        torch.tensor([[1.0, 2.0, 0.0], [3.0, 2.0, 0.0]], dtype=torch.float64), 3, torch.Generator()
    )
    torch.testing.assert_close(small[0], torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))  # rank 1 after centring
    assert torch.equal(small[1:], torch.zeros(2, 3, dtype=torch.float64))


def test_client_subspace_shapes():
    u, g = torch.rand(4, 10, 6, dtype=torch.float64), torch.rand(4, 10, 6, dtype=torch.float64)
    s = client_subspaces(u, g, 2, torch.Generator().manual_seed(0))
    assert s.homophily_levels.shape == (4, 2, 6) and s.homophily_all.shape == (2, 24)
    assert s.heterophily_levels.dtype == torch.float32


# --- FedICI: server ----------------------------------------------------------------------------------


def test_principal_angles_by_hand():
    e = torch.eye(3, dtype=torch.float64)
    phi = 0.3
    rotated = math.cos(phi) * e[0] + math.sin(phi) * e[1]
    lines = torch.stack([e[0:1], rotated.unsqueeze(0), e[2:3]])  # [3, 1, 3]
    cos = subspace_cosines(lines)
    torch.testing.assert_close(cos.diagonal(), torch.ones(3, dtype=torch.float64))
    assert cos[0, 1].item() == pytest.approx(math.cos(phi)) and cos[0, 2].item() == pytest.approx(0.0, abs=1e-12)
    planes = torch.stack([e[[0, 1]], e[[1, 0]] * -2.0, e[[0, 2]]])  # the first two span the same plane
    cos = subspace_cosines(planes)
    assert cos[0, 1].item() == pytest.approx(1.0) and cos[0, 2].item() == pytest.approx(math.cos(math.pi / 4))
    torch.testing.assert_close(cos, cos.T)
    # the official greedy matching of rows, averaged over 3 whatever q is: angles 0 and π/2 → cos(π/6)
    greedy = greedy_subspace_cosines(planes)
    # (abs 1e-4: the official + 1e-10 under the cosines' denominator moves arccos(1) by ~1e-5)
    assert greedy[0, 2].item() == pytest.approx(math.cos(math.pi / 6), abs=1e-4)
    assert greedy[0, 1].item() == pytest.approx(
        math.cos(math.pi / 3), abs=1e-4
    )  # cosines 0 and −1: greedy takes 0, 0 → π/2 + π/2


def test_simplex_projection_and_the_official_newton_step():
    h = torch.tensor([[1.2, 0.1, -0.3], [0.6, 0.6, -0.2], [1 / 3, 1 / 3, 1 / 3]], dtype=torch.float64)
    w = simplex_projection(h)
    torch.testing.assert_close(
        w, torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]], dtype=torch.float64)
    )
    # one Newton step from b = 0: b = ((1/M) Σ ReLU(−h)) / (1 − #neg/M)
    newton = one_newton_threshold(h)
    torch.testing.assert_close(
        newton[1], torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    )  # exact when one step suffices
    torch.testing.assert_close(
        newton[0], torch.tensor([1.05, 0.0, 0.0], dtype=torch.float64)
    )  # b = 0.15: row sums to 1.05


def test_affinities_rows_sum_to_one_and_the_code_symmetrises():
    t = torch.tensor([[-1.0, 0.2, 0.5], [0.2, -1.0, -0.4], [0.5, -0.4, -1.0]], dtype=torch.float64)
    h = affinities(t, gamma=2.0)
    torch.testing.assert_close(h.sum(dim=1), torch.ones(3, dtype=torch.float64))
    code = affinities(t, gamma=2.0, rule="code")
    torch.testing.assert_close(code, code.T)
    torch.testing.assert_close(code[0], h[0])  # row 0 uses its own sum in both


def _subspaces(m: int, q: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p = torch.linalg.qr(torch.randn(m, d, q, generator=g, dtype=torch.float64)).Q.transpose(1, 2)  # orthonormal rows
    r = torch.linalg.qr(torch.randn(m, d, q, generator=g, dtype=torch.float64)).Q.transpose(1, 2)
    return p, r


def test_client_graph_is_stochastic_and_ties_identical_clients():
    p, q = _subspaces(5, 2, 8, seed=0)
    p[3], q[3] = p[1], q[1]  # client 3 is a copy of client 1
    params = FedICIParams(alpha=0.3, beta=1.5, gamma=0.5)
    w, t = learn_client_graph(initial_client_graph(5), p, q, params)
    torch.testing.assert_close(t, t.T)  # principal angles are symmetric
    assert (w >= 0).all()
    torch.testing.assert_close(w.sum(dim=1), torch.ones(5, dtype=torch.float64))
    assert (w.diagonal() > 0.2).all()  # t_ii = α − β is the smallest: every client keeps weight on itself
    torch.testing.assert_close(w[1], w[3])  # identical clients weigh everyone alike ...
    assert w[1, 1].item() == pytest.approx(w[1, 3].item())  # ... and each other as they weigh themselves
    assert w[3, 1].item() == pytest.approx(w[3, 3].item())
    # the official reshape reads client rows out of the [qD, M] transpose, so a copy is no longer a copy
    code, code_t = learn_client_graph(initial_client_graph(5), p, q, dataclasses.replace(params, graph_rule="code"))
    torch.testing.assert_close(code_t, code_t.T)
    assert (code >= 0).all() and not torch.allclose(code[1], code[3])


def test_graph_favours_similar_homophily_and_complementary_heterophily():
    p, q = _subspaces(3, 1, 6, seed=1)
    p[1] = p[0]  # client 1: same low-frequency subspace as client 0
    q[2] = q[0]  # client 2: same high-frequency subspace as client 0
    w, _ = learn_client_graph(initial_client_graph(3), p, q, FedICIParams(alpha=0.5, beta=0.5, gamma=1.0))
    assert w[0, 1] > w[0, 2]
    uniform, t = learn_client_graph(initial_client_graph(3), p, q, FedICIParams(alpha=0.0, beta=0.0))
    assert torch.equal(t, torch.zeros(3, 3, dtype=torch.float64))
    torch.testing.assert_close(uniform, torch.full((3, 3), 1 / 3, dtype=torch.float64))


def test_personalised_states_mix_filter_levels_by_their_own_graph():
    states = [
        {"level_weights": torch.tensor([[1.0], [1.0], [1.0]]), "classifier.weight": torch.tensor([[2.0]])},
        {"level_weights": torch.tensor([[3.0], [5.0], [7.0]]), "classifier.weight": torch.tensor([[4.0]])},
    ]
    overall = torch.tensor([[1.0, 0.0], [0.5, 0.5]], dtype=torch.float64)
    levels = torch.tensor([[[0.0, 1.0], [0.0, 1.0]], [[0.25, 0.75], [1.0, 0.0]]], dtype=torch.float64)  # W^(1), W^(2)
    mixed = personalised_states(states, overall, levels)
    torch.testing.assert_close(mixed[0]["classifier.weight"], torch.tensor([[2.0]]))
    torch.testing.assert_close(mixed[1]["classifier.weight"], torch.tensor([[3.0]]))
    torch.testing.assert_close(
        mixed[0]["level_weights"], torch.tensor([[1.0], [5.0], [5.5]])
    )  # W row, W^(1) row, W^(2) row
    torch.testing.assert_close(mixed[1]["level_weights"], torch.tensor([[2.0], [5.0], [1.0]]))


# --- FedICI: runs ------------------------------------------------------------------------------------

SMALL = {"levels": "3", "hidden": "32", "graph_rounds": "2"}


def _run(federation, cpu, scheme="metis", clients=5, seed=0, rounds=4, **overrides):
    spec = make_spec(
        "fedici", "tiny", scheme, clients, seed, {**SMALL, **{k: str(v) for k, v in overrides.items()}}, rounds=rounds
    )
    return run(spec, federation, cpu)


def test_params_and_preset():
    with pytest.raises(UserError, match="UniFilter"):
        FedICIParams(backbone="gcn")
    with pytest.raises(UserError, match="graph_rule"):
        FedICIParams(graph_rule="greedy")
    cora = paper_preset(FedICI, "cora", "metis", 10)
    assert (
        cora["levels"] == "7" and cora["beta"] == "2.2" and "principal_dims" not in cora
    )  # k_principal: parser default 3
    assert paper_preset(FedICI, "minesweeper", "metis", 20)["gamma"] == "50"  # one block for every client count
    assert paper_preset(FedICI, "tiny", "metis", 5) == {}


def test_the_paper_protocol_runs_the_released_code_and_each_reading_switches_alone():
    """The published cells came from the released code: `paper` runs its graph rule and its bases; the
    corrected math is two independent switches, and the Params defaults (explicit runs' keys) stay put."""
    assert (FedICIParams().graph_rule, FedICIParams().backbone) == ("paper", "unifilter")
    paper = make_spec("fedici", "cora", "metis", 10, 0).params
    assert (paper.graph_rule, paper.backbone, paper.hidden, paper.lr) == ("code", "unifilter-code", 512, 0.15)
    rule = make_spec("fedici", "cora", "metis", 10, 0, {"graph_rule": "paper"}).params
    assert (rule.graph_rule, rule.backbone) == ("paper", "unifilter-code")
    basis = make_spec("fedici", "cora", "metis", 10, 0, {"backbone": "unifilter"}).params
    assert (basis.graph_rule, basis.backbone) == ("code", "unifilter")
    # both switched back: the configuration the stored runs of the corrected math had (same values, same key)
    corrected = make_spec("fedici", "cora", "metis", 10, 0, {"graph_rule": "paper", "backbone": "unifilter"})
    assert corrected.params == dataclasses.replace(paper, graph_rule="paper", backbone="unifilter")


def test_alpha_beta_zero_is_the_uniform_mean(tiny_federation):
    params = dataclasses.replace(FedICIParams(levels=3, hidden=16), alpha=0.0, beta=0.0)
    server, clients = build_parties(FedICI, params, tiny_federation, rounds=2)
    for index in range(2):
        rnd = Round(index)
        downloads = server.configure(rnd, list(range(len(clients))))
        uploads = {c.cid: c.fit(rnd, downloads[c.cid]) for c in clients}
        server.aggregate(rnd, uploads)
        mean = weighted_mean([u["weights"] for u in uploads.values()], torch.ones(len(clients)))
        for cid in range(len(clients)):
            for key, value in mean.items():
                torch.testing.assert_close(server.personalised[cid][key], value)


def test_runs_on_tiny_are_deterministic_and_send_subspaces_only_while_learning_graphs(tiny_federation, cpu):
    a = _run(tiny_federation, cpu, seed=3)
    b = _run(tiny_federation, cpu, seed=3)
    c = _run(tiny_federation, cpu, seed=4)
    assert a["status"] == "ok" and a["curves"] == b["curves"] and a["diagnostics"] == b["diagnostics"]
    assert a["curves"] != c["curves"]
    up = a["bytes_up"]
    assert up[0] == up[1] > up[2] == up[3]  # subspaces in rounds 0 and 1 only
    weights = sum(
        p.numel() * 4
        for p in UniFilter(tiny_federation.num_features, 32, tiny_federation.num_classes, 0.0, levels=3)
        .state_dict()
        .values()
    )
    assert up[2] == 5 * weights
    assert up[0] - up[2] == 5 * 4 * (3 * 3) * 4 * tiny_federation.num_features  # 4 subspaces of q·K·F floats each
    assert all(1 / 5 < w < 1 for w in a["diagnostics"]["self_weight"])  # personalised, not uniform, not local


def test_code_rules_and_overlapping_partitions_run(cpu):
    overlap = DataCache(None, None).federated("tiny", "overlap", 10, 1234)
    paper = _run(overlap, cpu, scheme="overlap", clients=10, rounds=3)
    code = _run(overlap, cpu, scheme="overlap", clients=10, rounds=3, graph_rule="code", backbone="unifilter-code")
    assert paper["status"] == code["status"] == "ok"
    assert paper["diagnostics"] != code["diagnostics"]
    assert 0.0 <= code["test"] <= 1.0 and 0.0 <= paper["test"] <= 1.0
