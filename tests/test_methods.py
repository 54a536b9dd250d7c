"""The four simple methods do what their papers say, checked through the real runner."""

from __future__ import annotations

import torch
from parties import build_parties

from gflbench.baselines.fedper import FedPer
from gflbench.core.aggregation import model_state
from gflbench.core.method import Round, method_class, resolve_params
from gflbench.experiments.runner import run
from gflbench.experiments.spec import make_spec


def _run(method, federation, device, seed=0, rounds=6, local_epochs=None, **overrides):
    overrides = {k: str(v) for k, v in overrides.items()}
    spec = make_spec(method, "tiny", "metis", 5, seed, overrides, rounds=rounds, local_epochs=local_epochs)
    return run(spec, federation, device)


def test_fedprox_with_zero_mu_is_fedavg(tiny_federation, device):
    fedavg = _run("fedavg", tiny_federation, device, local_epochs=3, backbone="gcn")
    fedprox = _run("fedprox", tiny_federation, device, local_epochs=3, mu=0.0)
    assert fedavg["curves"] == fedprox["curves"]
    # the proximal term has zero gradient at the received weights, so it only acts from the 2nd local step
    different = _run("fedprox", tiny_federation, device, local_epochs=3, mu=10.0)
    assert different["curves"] != fedprox["curves"]


def test_fedper_never_shares_its_head(tiny_federation, device):
    server, clients = build_parties(FedPer, resolve_params(FedPer, {}), tiny_federation, 3, device)
    for index in range(3):
        rnd = Round(index)
        downloads = server.configure(rnd, list(range(len(clients))))
        uploads = {}
        for cid, client in enumerate(clients):
            assert not any(k.startswith("classifier") for k in downloads[cid]["weights"])
            uploads[cid] = client.fit(rnd, downloads[cid])
            assert not any(k.startswith("classifier") for k in uploads[cid]["weights"])
            assert any(k.startswith("conv1") for k in uploads[cid]["weights"])
        server.aggregate(rnd, uploads)
    assert set(server.global_weights) == set(model_state(clients[0].model, exclude_prefix="classifier"))
    heads = [c.model.classifier.weight for c in clients]
    assert not torch.allclose(heads[0], heads[1])  # personalised heads drift apart


def test_fedavg_clients_start_each_round_from_the_global_model(tiny_federation, device):
    record = _run("fedavg", tiny_federation, device, rounds=3)
    weights_bytes = record["bytes_down"][0] // 5
    assert record["bytes_up"][0] > 5 * weights_bytes  # weights up plus the training-node counts
    assert all(b == record["bytes_down"][0] for b in record["bytes_down"])


def test_local_sends_nothing(tiny_federation, device):
    record = _run("local", tiny_federation, device, rounds=3)
    assert record["bytes_up"] == [0, 0, 0] and record["bytes_down"] == [0, 0, 0]


def test_runs_are_deterministic_per_seed(tiny_federation, device):
    a = _run("fedavg", tiny_federation, device, seed=3)
    b = _run("fedavg", tiny_federation, device, seed=3)
    c = _run("fedavg", tiny_federation, device, seed=4)
    assert a["curves"] == b["curves"]
    assert a["curves"] != c["curves"]


def test_default_backbones_follow_the_papers_numbers():
    """The baselines' cells are FED-PUB's GCN runs (docs/protocol.md), whatever B.6 says; FedGMC runs on H2GCN."""
    assert resolve_params(method_class("fedgmc"), {}).backbone.startswith("h2gcn")
    for name in ("local", "fedavg", "fedprox", "fedper", "gcfl", "fedgnn"):
        assert resolve_params(method_class(name), {}).backbone == "gcn"


def test_fedavg_with_one_client_is_local(device):
    from gflbench.experiments.runner import DataCache

    single = DataCache(None, None).federated("tiny", "metis", 1, 1234)
    local = run(make_spec("local", "tiny", "metis", 1, 0, rounds=6), single, device)
    fedavg = run(make_spec("fedavg", "tiny", "metis", 1, 0, rounds=6), single, device)
    assert local["curves"] == fedavg["curves"]  # loading back one's own average changes nothing
