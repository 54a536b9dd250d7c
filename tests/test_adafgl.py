"""AdaFGL: the HCS test picks the right branch on clean toy graphs, the refined topology matches its
formula by hand and densely, the blocked learnable topology equals the official dense code, stage 1 is
FedAvg, and the stages show in the record; through the real runner and the CLI on `tiny`."""

from __future__ import annotations

import gzip
import itertools
import json
import math
from pathlib import Path

import pytest
import torch
from parties import build_parties
from test_scale import NoDenseSquare
from torch.nn import functional as F
from typer.testing import CliRunner

import gflbench.baselines.adafgl as adafgl
from gflbench.backbones.graph_ops import binary_adjacency, gcn_adjacency
from gflbench.baselines.adafgl import (
    AdaFGL,
    AdaFGLParams,
    PersonalModel,
    SignedPropagation,
    first_personal_round,
    fusion_weights,
    homophily_confidence,
    label_propagation,
    phase,
    refine,
    refined_features,
    unit_rows,
)
from gflbench.commands.app import app
from gflbench.core.method import Round, resolve_params
from gflbench.core.metrics import accuracy
from gflbench.data import DATASETS
from gflbench.errors import UserError
from gflbench.experiments.runner import run
from gflbench.experiments.spec import make_spec
from gflbench.experiments.store import RunStore
from gflbench.paper.tables import rule_overrides


def _undirected(pairs: list[tuple[int, int]]) -> torch.Tensor:
    e = torch.tensor(pairs).T
    return torch.cat([e, e.flip(0)], dim=1)


def _hcs(pairs, y, seed=0) -> float:
    n = y.numel()
    operator = gcn_adjacency(_undirected(pairs), n)
    return float(
        homophily_confidence(
            operator, y, torch.arange(n), int(y.max()) + 1, 10, 0.5, torch.Generator().manual_seed(seed)
        )
    )


# ------------------------------------------------------------------------------------ HCS test


def test_label_propagation_reinforces_the_seeds_each_step():
    operator = gcn_adjacency(_undirected([(0, 1)]), 3)  # node 2 isolated: Â[2, 2] = 1
    start = torch.tensor([[1.0, 0.0], [0.5, 0.5], [0.5, 0.5]])
    seeds = torch.tensor([True, False, False])
    y = label_propagation(operator, start, seeds, steps=1, alpha=0.5)
    # one step: αÂY⁰ + (1-α)Y⁰, plus Y⁰ again on the seed row; Â on the edge is [[1/2, 1/2], [1/2, 1/2]]
    expected = (
        0.5 * torch.tensor([[0.75, 0.25], [0.75, 0.25], [0.5, 0.5]])
        + 0.5 * start
        + torch.tensor([[1.0, 0.0], [0, 0], [0, 0]])
    )
    torch.testing.assert_close(y, expected)
    torch.testing.assert_close(label_propagation(operator, start, seeds, steps=0, alpha=0.5), start)


def test_homophily_test_picks_the_homophilous_branch_on_a_clean_homophilous_graph():
    y = torch.tensor([0] * 10 + [1] * 10)
    rings = [(i, (i + 1) % 10) for i in range(10)] + [(10 + i, 10 + (i + 1) % 10) for i in range(10)]  # no edge across
    params = AdaFGLParams()
    for seed in range(5):
        hcs = _hcs(rings, y, seed)
        assert hcs == 1.0
        assert fusion_weights(hcs, params) == (1.0, 0.0)


def test_homophily_test_picks_the_heterophilous_branch_on_a_clean_heterophilous_graph():
    y = torch.tensor([0] * 10 + [1] * 10)
    bipartite = [(i, j) for i in range(10) for j in range(10, 20)]  # every edge joins the two classes
    params = AdaFGLParams()
    for seed in range(5):
        hcs = _hcs(bipartite, y, seed)
        assert hcs < 0.5  # mostly 0: a held-out node sees only the other class at one hop
        assert fusion_weights(hcs, params) == (0.0, 1.0)
    mixed = AdaFGLParams(fusion="mix")
    assert fusion_weights(0.3, mixed) == (0.3, 0.7)  # OpenFGL: both branches, weighted by HCS


def test_hcs_holds_out_half_of_the_training_nodes_and_is_seeded():
    y = torch.tensor([0, 1] * 10)
    ring = [(i, (i + 1) % 20) for i in range(20)]
    a, b = _hcs(ring, y, 3), _hcs(ring, y, 3)
    assert a == b
    seeds, held = adafgl.split_train(torch.arange(7), torch.Generator().manual_seed(0))
    assert seeds.numel() == 3 and held.numel() == 4 and sorted(torch.cat([seeds, held]).tolist()) == list(range(7))


# --------------------------------------------------------------------------- topology refinement


def _path_with_twins():
    """Path 0-1-2-3; nodes 0 and 3 have the same extractor prediction, 1 and 2 others: A_k = {0-3}."""
    edges = _undirected([(0, 1), (1, 2), (2, 3)])
    extractor = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    return edges, extractor


def test_refined_topology_by_hand():
    edges, extractor = _path_with_twins()
    graph = type("G", (), {})()
    graph.x, graph.num_nodes = torch.eye(4), 4
    adjacency = binary_adjacency(edges, 4)
    # α = 0.5: every degree of αA + (1-α)A_k + I is 2, so Â_opt = (A_opt + I)/2, the 4-cycle 0-1-2-3-0
    refined = refine(graph, adjacency, extractor, AdaFGLParams(alpha=0.5, prop_steps=2))
    assert float(refined.similar_pairs) == 2.0  # (0, 3) and (3, 0); softmax(P) rows of different classes have cos 0.69
    a1 = torch.tensor([[0.5, 0.25, 0.0, 0.25], [0.25, 0.5, 0.25, 0.0], [0.0, 0.25, 0.5, 0.25], [0.25, 0.0, 0.25, 0.5]])
    a2 = torch.tensor(
        [[0.375, 0.25, 0.125, 0.25], [0.25, 0.375, 0.25, 0.125], [0.125, 0.25, 0.375, 0.25], [0.25, 0.125, 0.25, 0.375]]
    )
    torch.testing.assert_close(refined.smoothed, torch.cat([torch.eye(4), a1, a2], dim=1))
    # α = 0.05 (official): degrees 2, 1.1, 1.1, 2
    refined = refine(graph, adjacency, extractor, AdaFGLParams(prop_steps=1))
    s = refined.smoothed[:, 4:]
    torch.testing.assert_close(s[0], torch.tensor([0.5, 0.05 / math.sqrt(2.2), 0.0, 0.95 / 2]))
    torch.testing.assert_close(s[1], torch.tensor([0.05 / math.sqrt(2.2), 1 / 1.1, 0.05 / 1.1, 0.0]))


def _dense_refined(x, adjacency, q_unit, alpha, above, steps):
    """The official formula with dense matrices (reference only)."""
    n = x.shape[0]
    similar = (q_unit @ q_unit.T > above).float()
    similar.fill_diagonal_(0.0)
    a_opt = alpha * adjacency.to_dense() + (1 - alpha) * similar + torch.eye(n)
    scale = a_opt.sum(1).pow(-0.5)
    operator = scale[:, None] * a_opt * scale[None, :]
    hops = [x]
    for _ in range(steps):
        hops.append(operator @ hops[-1])
    return torch.cat(hops, dim=1)


def _random_case(n=23, c=3, f=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (40,), generator=gen)
    dst = torch.randint(0, n, (40,), generator=gen)
    keep = src != dst
    adjacency = binary_adjacency(_undirected(list(zip(src[keep].tolist(), dst[keep].tolist()))), n)
    labels = torch.randint(0, c, (n,), generator=gen)
    extractor = F.one_hot(labels, c).float() * 6  # confident, so twins exist inside each class
    extractor[: n // 3] = torch.rand(n // 3, c, generator=gen)  # and some that are not
    q_unit = unit_rows(extractor.softmax(1).softmax(1))
    return torch.randn(n, f, generator=gen), adjacency, q_unit, labels


def test_blocked_refinement_equals_the_dense_formula(monkeypatch):
    x, adjacency, q_unit, _ = _random_case()
    monkeypatch.setattr(adafgl, "BLOCK_ELEMENTS", 50)  # blocks of 2 rows
    blocked = refined_features(x, adjacency, q_unit, 0.05, 0.999, 3)
    torch.testing.assert_close(blocked, _dense_refined(x, adjacency, q_unit, 0.05, 0.999, 3))


# ------------------------------------------------------------------- learnable signed topology


def _official_signed(module: SignedPropagation, smoothed, q_unit):
    """HetePropagateLayer.forward of the official code, dense, with the module's weights (reference only)."""
    h = smoothed
    for linear in module.linears[:-1]:
        h = module.activation(linear(h))
    e = module.linears[-1](h)
    s = e.softmax(1)
    re = s @ s.T
    norms = torch.diag(re).unsqueeze(1)
    re = re / torch.max(torch.sqrt(norms @ norms.T), 1e-9 * torch.ones_like(re))
    re = re - torch.diag(torch.diag(re))
    similar = (q_unit @ q_unit.T > module.above).float()
    similar = similar - torch.diag(torch.diag(similar))
    t = module.beta * similar + (1 - module.beta) * re
    mean, top = t.mean(), t.max()
    t = t - mean
    t = torch.where(t > 0, t / (top - mean), -((t + mean) / mean))
    t = t + torch.eye(t.shape[0])
    pos, neg = module.activation(t), module.activation(-t)
    return ((torch.softmax(pos @ e, 1) - torch.softmax(neg @ e, 1)) + e) / 2


def test_blocked_signed_propagation_equals_the_official_dense_code(monkeypatch):
    x, adjacency, q_unit, _ = _random_case()
    smoothed = refined_features(x, adjacency, q_unit, 0.05, 0.999, 2)
    similar_pairs = adafgl.similar_product(q_unit, torch.ones(x.shape[0], 1), 0.999).sum()
    torch.manual_seed(0)
    module = SignedPropagation(smoothed.shape[1], 8, 3, dropout=0.0, beta=0.2, above=0.999)
    with torch.no_grad():
        module.activation.weight.fill_(0.1)  # a slope of its own, so both signals differ from ReLU

    reference = _official_signed(module, smoothed, q_unit)
    (reference.square().sum()).backward()
    expected_grads = [p.grad.clone() for p in module.parameters()]
    module.zero_grad()

    monkeypatch.setattr(adafgl, "BLOCK_ELEMENTS", 50)  # 2 rows per block, checkpointed
    blocked = module(smoothed, q_unit, similar_pairs)
    torch.testing.assert_close(blocked, reference)
    (blocked.square().sum()).backward()
    for got, expected in zip((p.grad for p in module.parameters()), expected_grads):
        torch.testing.assert_close(got, expected)


def test_stage_two_builds_no_dense_node_by_node_matrix(tiny_federation, cpu, monkeypatch):
    params = resolve_params(
        AdaFGL,
        {
            "stage2_rounds": "2",
            "stage2_epochs": "2",
            "fusion": "mix",
            "hidden": "16",
            "stage2_hidden": "16",
            "prop_steps": "1",
        },
    )
    server, clients = build_parties(AdaFGL, params, tiny_federation, 2, cpu)
    monkeypatch.setattr(adafgl, "BLOCK_ELEMENTS", 400)
    downloads = server.configure(Round(0), [c.cid for c in clients])
    for client in clients:
        n = client.graph.num_nodes
        assert 400 // n < n  # several row blocks per client
        with NoDenseSquare(n):
            client.fit(Round(0), downloads[client.cid])
            client.predict()
        assert client.personal.homophilous is not None and client.personal.heterophilous is not None


# --------------------------------------------------------------------------------- the stages


def test_stage_schedule_and_params():
    params = AdaFGLParams(stage2_rounds=3)
    assert [phase(i, params, 6) for i in range(6)] == ["extract"] * 3 + ["adapt"] + ["personalise"] * 2
    assert first_personal_round(params, 2) == 0  # fewer rounds than stage 2 asks for: no stage 1
    assert first_personal_round(AdaFGLParams(), 100) == 99  # default: the official 200 epochs in the last round
    assert AdaFGLParams().stage2_epochs == 200
    with pytest.raises(UserError, match="fusion"):
        AdaFGLParams(fusion="average")
    with pytest.raises(UserError, match="weighting"):
        AdaFGLParams(weighting="edges")


def test_stage_one_is_fedavg_weighted_by_node_counts(tiny_federation, cpu):
    params = resolve_params(AdaFGL, {"stage2_rounds": "2"})
    server, clients = build_parties(AdaFGL, params, tiny_federation, 4, cpu)
    ids = [c.cid for c in clients]
    downloads = server.configure(Round(0), ids)
    uploads = {c.cid: c.fit(Round(0), downloads[c.cid]) for c in clients}
    server.aggregate(Round(0), uploads)
    sizes = torch.tensor([float(c.graph.num_nodes) for c in clients])
    key = "conv1.lin.weight"
    expected = sum(w * u["weights"][key] for w, u in zip(sizes / sizes.sum(), uploads.values()))
    torch.testing.assert_close(server.global_weights[key], expected)
    assert server.diagnostics() == {"stage": 1.0}


def _run(federation, cpu, method="adafgl", rounds=6, seed=0, **overrides):
    spec = make_spec(method, "tiny", "metis", 5, seed, {k: str(v) for k, v in overrides.items()}, rounds=rounds)
    return run(spec, federation, cpu)


def test_stage_one_with_a_plain_mean_is_fedavg(tiny_federation, cpu):
    fedavg = _run(tiny_federation, cpu, method="fedavg", backbone="gcn")
    ours = _run(tiny_federation, cpu, stage2_rounds=2, stage2_epochs=3, weighting="uniform")
    assert ours["curves"]["val"][:4] == fedavg["curves"]["val"][:4]
    assert ours["curves"]["test"][:4] == fedavg["curves"]["test"][:4]


def test_end_to_end_on_tiny_metis_records_the_stages(tiny_federation, cpu):
    record = _run(tiny_federation, cpu, rounds=7, stage2_rounds=4, stage2_epochs=4, keep_best_epoch=True)
    again = _run(tiny_federation, cpu, rounds=7, stage2_rounds=4, stage2_epochs=4, keep_best_epoch=True)
    assert record["status"] == "ok" and record["curves"] == again["curves"]  # seeded
    assert record["diagnostics"]["stage"] == [1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0]
    assert record["config"]["params"]["stage2_rounds"] == 4 and record["config"]["params"]["stage2_epochs"] == 4
    assert all(b > 0 for b in record["bytes_up"][:3]) and record["bytes_up"][3:] == [0, 0, 0, 0]
    assert record["bytes_down"][3] == record["bytes_down"][0] and record["bytes_down"][4:] == [
        0,
        0,
        0,
    ]  # extractor once
    for client in range(5):  # each client keeps its own best validation prediction: never falls in stage 2
        values = [round_values[client] for round_values in record["client_curves"]["val"][3:]]
        assert all(b >= a for a, b in itertools.pairwise(values))
    assert record["test"] > 0.5


def test_end_to_end_on_tiny_overlap_through_the_cli(tmp_path, monkeypatch):
    monkeypatch.setenv("GFLBENCH_DATA", str(tmp_path / "data"))
    store = tmp_path / "runs.sqlite"
    args = ["run", "-m", "adafgl", "-d", "tiny", "--partition", "overlap", "--clients", "10", "--seeds", "1",
            "--rounds", "5", "--store", str(store), "--device", "cpu", "--set", "adafgl.stage2_rounds=3",
            "--set", "adafgl.stage2_epochs=4"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    with RunStore(store) as s:
        (record,) = s.records()
    assert record["status"] == "ok" and record["scheme"] == "overlap" and record["clients"] == 10
    assert record["diagnostics"]["stage"] == [1.0, 1.0, 2.0, 2.0, 2.0]
    assert record["config"]["params"]["stage2_rounds"] == 3
    assert 0.5 < record["test"] <= 1.0


# ------------------------------------------------------------------------ the best-epoch switch


def _stage_two_predictions(
    federation, cpu, monkeypatch, keep_best: bool
) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """Every client's kept stage-2 prediction after one round of 40 epochs, and each prediction computed on the way."""
    values = {"stage2_epochs": "40", "stage2_lr": "0.05", "keep_best_epoch": str(keep_best)}
    server, clients = build_parties(AdaFGL, resolve_params(AdaFGL, values), federation, 1, cpu)
    seen: list[torch.Tensor] = []
    original = PersonalModel.probabilities
    monkeypatch.setattr(PersonalModel, "probabilities", lambda self: seen.append(original(self)) or seen[-1])
    downloads = server.configure(Round(0), [c.cid for c in clients])  # one round: it is round R1
    kept, computed = [], []
    for client in clients:
        seen.clear()
        client.fit(Round(0), downloads[client.cid])
        kept.append(client.kept)  # `predict` returns its log
        computed.append(list(seen))
    monkeypatch.undo()
    return kept, computed


def test_the_switch_keeps_each_clients_best_epoch_and_off_the_latest(tiny_federation, cpu, monkeypatch):
    """Off (default): the prediction is the last epoch's, computed once. On: the client's first best epoch on its
    own validation nodes. Both train the same models (evaluation draws no random numbers), so off's prediction is
    on's 40th; in this case two of the five clients score better at an earlier epoch, so the settings differ there."""
    latest, once = _stage_two_predictions(tiny_federation, cpu, monkeypatch, keep_best=False)
    best, every = _stage_two_predictions(tiny_federation, cpu, monkeypatch, keep_best=True)
    graphs = tiny_federation.on_device(AdaFGLParams(), cpu)
    earlier = 0
    for graph, off, on, one, epochs in zip(graphs, latest, best, once, every):
        assert len(one) == 1 and len(epochs) == 40
        assert torch.equal(off, epochs[-1])  # off = the latest epoch of the same training
        val = graph.val_mask
        scores = [float(accuracy(p[val], graph.y[val])) for p in epochs]
        chosen = scores.index(max(scores))  # the first epoch with the best own-validation accuracy
        assert torch.equal(on, epochs[chosen])
        earlier += scores[chosen] > scores[-1]  # its best epoch beats its latest: the two settings predict differently
    assert earlier > 0  # the case exercises the difference


def test_runs_stored_before_the_switch_are_found_with_it_on():
    """The AdaFGL records committed before the switch existed kept the best epoch and ran stage 1 at the shared
    values; they were re-keyed with the switch on filled in (gfl_bench/experiments/upgrades.py): switched on, at
    those values and their schedule, a run has their key; the new default (off, the official stage-1 values of
    presets/adafgl.csv) is another experiment with its own key."""
    path = Path(__file__).resolve().parents[1] / "results" / "records" / "2026-12-02-paper.jsonl.gz"
    with gzip.open(path, "rt") as lines:
        stored = [r for r in map(json.loads, lines) if r["method"] == "adafgl" and r["protocol"] == "paper"]
    assert stored
    for record in stored:
        cell = (record["dataset"], record["scheme"], record["clients"], record["seed"])
        # ... and on the dataset's own features (the preset's `feature_norm=none` on Planetoid came later still)
        own = DATASETS[record["dataset"]].feature_norm
        shared = {"keep_best_epoch": "true", "hidden": "128", "weight_decay": "1e-06", "feature_norm": own}
        schedule = {"rounds": record["config"]["rounds"], "local_epochs": record["config"]["local_epochs"]}
        on = make_spec("adafgl", *cell, shared, protocol="paper", **schedule)
        off = make_spec("adafgl", *cell, protocol="paper")
        assert record["upgrades"][0]["filled"] == {"keep_best_epoch": True}
        assert on.config()["params"]["keep_best_epoch"] is True and on.run_key == record["run_key"]
        assert off.params.keep_best_epoch is False and off.config()["params"]["keep_best_epoch"] is False
        assert off.run_key != record["run_key"]


def test_per_client_selection_switches_on_the_methods_own_rule_unless_set():
    assert rule_overrides("adafgl", "per-client", {}) == {"keep_best_epoch": "true"}
    assert rule_overrides("adafgl", "per-client", {"keep_best_epoch": "false"}) == {"keep_best_epoch": "false"}
    assert rule_overrides("adafgl", "global", {"lr": "0.1"}) == {"lr": "0.1"}
    assert rule_overrides("fedavg", "per-client", {}) == {}  # selects nothing inside itself
    with pytest.raises(UserError, match="unknown selection rule 'best'"):
        rule_overrides("adafgl", "best", {})
