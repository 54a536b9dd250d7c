"""GCFL splits a cluster exactly when its criterion holds, cuts where the updates disagree, and
averages only inside clusters; checked on the server directly and through the real runner."""

from __future__ import annotations

import copy

import pytest
import torch
from parties import build_parties

from gflbench.backbones import GCN
from gflbench.baselines.gcfl import GCFL, NORMS, GCFLParams, dtw_distance, split_criterion
from gflbench.core.aggregation import model_state
from gflbench.core.method import Round, Setup, resolve_params
from gflbench.experiments.runner import run
from gflbench.experiments.spec import make_spec

GROUP_A, GROUP_B = [0, 1, 2], [3, 4, 5]


def _server(num_clients: int = 6, **overrides: str):
    params = resolve_params(GCFL, {"eps1": "0.5", "eps2": "0.8", **overrides})
    setup = Setup(
        num_features=8,
        num_classes=3,
        num_clients=num_clients,
        rounds=30,
        local_epochs=1,
        device=torch.device("cpu"),
        seed=0,
    )
    torch.manual_seed(0)
    return GCFL.server(GCN(8, 4, 3, 0.5), params, setup)


def _uploads(server, scales: dict[int, float], sizes: dict[int, int] | None = None) -> dict:
    """Every client's update is `scale` times one fixed unit direction over the shared layers."""
    shared = server.cluster_weights[0]
    total = sum(v.numel() for v in shared.values()) ** 0.5
    direction = {k: torch.ones_like(v) / total for k, v in shared.items()}
    return {
        cid: {
            "update": {k: scale * v for k, v in direction.items()},
            "num_train": torch.tensor((sizes or {}).get(cid, 10)),
        }
        for cid, scale in scales.items()
    }


def _opposed(scale: float, n: int = 6) -> dict[int, float]:
    """The first half moves one way, the second half the other: mean update 0, each of length `scale`."""
    return {cid: scale if cid < n // 2 else -scale for cid in range(n)}


@pytest.mark.parametrize(
    ("round_index", "scales", "splits"),
    [
        (20, _opposed(1.0), True),  # round 21 (1-based), mean 0 < eps1, max 1 > eps2, 6 clients
        (19, _opposed(1.0), False),  # round 20: still in the official warm-up
        (20, {cid: 1.0 for cid in range(6)}, False),  # mean update 1 >= eps1: not stationary
        (20, _opposed(0.7), False),  # longest update 0.7 <= eps2: every client is stationary too
        (20, {0: 1.0, 1: -1.0}, False),  # a cluster of two is never split
    ],
)
def test_split_happens_exactly_when_the_criterion_holds(round_index, scales, splits):
    server = _server(num_clients=len(scales))
    server.aggregate(Round(round_index), _uploads(server, scales))
    assert (len(server.clusters) == 2) is splits
    if splits:  # the minimum cut separates the two opposed groups
        assert sorted(server.clusters) == [GROUP_A, GROUP_B]


def _updates(mean_norm: float, typical: float, longest: float, n: int = 10, dim: int = 4) -> torch.Tensor:
    """`n` updates whose mean has length `mean_norm`, with one opposed pair of length `longest` and
    the rest of length `typical`: a shared component along e0 plus +-a along e1 (pairs cancel)."""
    updates = torch.zeros(n, dim, dtype=torch.float64)
    updates[:, 0] = mean_norm
    for i in range(n):
        length = longest if i in (0, 1) else typical
        updates[i, 1] = (1 if i % 2 == 0 else -1) * (length**2 - mean_norm**2) ** 0.5
    return updates


@pytest.mark.parametrize(
    ("mean_norm", "longest", "splits"),
    [
        # scales of the un-split GCN runs after the warm-up (docs/baselines/gcfl.md): mean 0.44-0.77
        # (median 0.57), median client 1.8-3.5 (median 2.56), longest client 2.0-4.0
        (0.45, 3.3, True),  # more stationary than usual while one client moves unusually far
        (0.57, 3.3, False),  # a typical post-warm-up mean: not near a stationary point
        (0.45, 2.6, False),  # the longest update is only a typical client's length
        (0.57, 2.6, False),  # a typical round, where the former 1.0 / 2.0 split (as in every measured one)
    ],
)
def test_default_thresholds_split_only_atypical_rounds(mean_norm, longest, splits):
    updates = _updates(mean_norm, typical=2.5, longest=longest)
    assert updates.mean(dim=0).norm().item() == pytest.approx(mean_norm)
    assert updates.norm(dim=1).max().item() == pytest.approx(longest)
    assert split_criterion(updates, 20, GCFLParams()) is splits
    assert split_criterion(updates, 19, GCFLParams()) is False  # warm-up: rounds 1-20 (1-based)
    assert split_criterion(updates, 20, GCFLParams(eps1=1.0, eps2=2.0)) is True


def test_averaging_stays_inside_clusters():
    server = _server()
    before = {k: v.clone() for k, v in server.cluster_weights[0].items()}
    sizes = {0: 1, 1: 2, 2: 3, 3: 10, 4: 10, 5: 10}
    uploads = _uploads(server, {0: 1.0, 1: 2.0, 2: 0.5, 3: -1.0, 4: -1.0, 5: -1.0}, sizes)
    server.aggregate(Round(20), uploads)
    assert sorted(server.clusters) == [GROUP_A, GROUP_B]
    received = server.configure(Round(21), list(range(6)))
    key = next(iter(before))
    step = uploads[0]["update"][key]  # the unit-direction update of scale 1
    expected_a = before[key] + step * (1 * 1.0 + 2 * 2.0 + 3 * 0.5) / 6  # training-size-weighted mean
    for cid in GROUP_A:
        torch.testing.assert_close(received[cid]["weights"][key], expected_a)
    for cid in GROUP_B:
        torch.testing.assert_close(received[cid]["weights"][key], before[key] - step)

    # what cluster A receives does not depend on cluster B's updates
    other = _server()
    changed = dict(uploads)
    changed[4] = {"update": {k: -2 * v for k, v in uploads[0]["update"].items()}, "num_train": torch.tensor(7)}
    other.aggregate(Round(20), changed)
    assert sorted(other.clusters) == [GROUP_A, GROUP_B]
    again = other.configure(Round(21), list(range(6)))
    for cid in GROUP_A:
        for k, v in received[cid]["weights"].items():
            assert torch.equal(again[cid]["weights"][k], v)
    assert not torch.equal(again[3]["weights"][key], received[3]["weights"][key])


def test_gcfl_plus_cuts_by_gradient_norm_sequences():
    server = _server(variant="gcfl+", seq_length="3")
    uploads = _uploads(server, _opposed(1.0))
    for cid, upload in uploads.items():  # sequences disagree with the update directions on purpose
        upload["grad_norm"] = torch.tensor(1.0 if cid in (0, 3, 4) else 9.0)
    for index in range(18, 20):  # criterion holds from index 20 on; sequences are full from index 20
        server.aggregate(Round(index), uploads)
        assert len(server.clusters) == 1
    server.aggregate(Round(20), uploads)
    assert sorted(server.clusters) == [[0, 3, 4], [1, 2, 5]]
    assert all(seq == [] for seq in server.sequences.values())  # cleared after a split, as in the code
    server.aggregate(Round(21), uploads)  # both halves still qualify, but the sequences are too short
    assert len(server.clusters) == 2


def test_dtw_distance():
    assert dtw_distance([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == 0.0
    assert dtw_distance([0.0, 1.0], [0.0, 0.0, 1.0]) == 0.0  # warping absorbs the repeated value
    assert dtw_distance([0.0], [3.0, 4.0]) == 5.0  # sqrt(3² + 4²)
    assert dtw_distance([1.0, 5.0], [2.0]) == dtw_distance([2.0], [1.0, 5.0])


def test_client_uploads_its_shared_update_and_restarts_from_the_cluster_model(tiny_federation, cpu, monkeypatch):
    server, (client, *_) = build_parties(GCFL, resolve_params(GCFL, {}), tiny_federation, 3, cpu)
    sent = server.configure(Round(0), [0])[0]
    assert not any(k.startswith("classifier") for k in sent["weights"])  # official: only convs shared
    upload = client.fit(Round(0), copy.deepcopy(sent))
    trained = model_state(client.model)
    assert set(upload["update"]) == set(sent["weights"])
    for key, update in upload["update"].items():
        torch.testing.assert_close(update, trained[key] - sent["weights"][key])
    trained = {k: v.clone() for k, v in trained.items()}

    monkeypatch.setattr(client, "train_local", lambda: None)
    client.fit(Round(1), copy.deepcopy(sent))
    state = model_state(client.model)
    for key, value in state.items():  # shared layers reset to the cluster model, the head kept
        assert torch.equal(value, sent["weights"][key] if key in sent["weights"] else trained[key])


def _run(federation, cpu, seed, **overrides):
    spec = make_spec("gcfl", "tiny", "metis", 5, seed, {k: str(v) for k, v in overrides.items()}, rounds=8)
    return run(spec, federation, cpu)


def test_splits_happen_in_the_round_loop_and_runs_are_deterministic(tiny_federation, cpu):
    eager = {"eps1": 100.0, "eps2": 0.0, "warmup_rounds": 3}  # criterion holds whenever allowed
    a = _run(tiny_federation, cpu, 3, **eager)
    b = _run(tiny_federation, cpu, 3, **eager)
    c = _run(tiny_federation, cpu, 4, **eager)
    clusters = a["diagnostics"]["clusters"]
    assert clusters[:3] == [1.0, 1.0, 1.0] and clusters[3] == 2.0 and clusters[-1] >= 2.0
    assert a["curves"] == b["curves"] and a["diagnostics"] == b["diagnostics"]
    assert a["curves"] != c["curves"]
    assert set(a["diagnostics"]) == {"clusters", *NORMS}
    never = {"eps1": 100.0, "eps2": 1000.0, "warmup_rounds": 3}  # no client update is that long
    diagnostics = _run(tiny_federation, cpu, 3, **never)["diagnostics"]
    assert diagnostics["clusters"] == [1.0] * 8
    # one cluster of everyone: the splittable clusters' smallest mean norm is the federation's
    assert diagnostics["min_cluster_mean_norm"] == diagnostics["mean_update_norm"]
    assert all(mean <= top and median <= top for mean, median, top in zip(*(diagnostics[k] for k in NORMS[:3])))


def test_params_are_checked():
    from gflbench.errors import UserError

    with pytest.raises(UserError):
        GCFLParams(variant="gcfl++")
    with pytest.raises(UserError):
        GCFLParams(share="head")
