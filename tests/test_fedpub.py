"""FED-PUB: row-stochastic similarity mixing, a seeded proxy graph, masks that never leave the client,
regularisers that act only in the paper's mode; checked directly and through the real runner."""

from __future__ import annotations

import torch

from baselines.fedpub import FedPub, FedPubClient, FedPubParams, MaskedGCN, mixing_weights, proxy_graph
from gfl_bench.backbones import GCN
from gfl_bench.runner import run
from gfl_bench.spec import make_spec


def _run(federation, cpu, seed=0, rounds=4, **overrides):
    spec = make_spec("fedpub", "tiny", "metis", 5, seed, {k: str(v) for k, v in overrides.items()}, rounds=rounds)
    return run(spec, federation, cpu)


def test_mixing_weights_are_row_stochastic_and_favour_similar_clients():
    embeddings = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [-1.0, 0.2]])
    alpha = mixing_weights(embeddings, scale=10.0)
    assert (alpha > 0).all()
    torch.testing.assert_close(alpha.sum(dim=1), torch.ones(4, dtype=alpha.dtype))
    assert alpha[0, 1] > alpha[0, 2] > alpha[0, 3]  # exp(τ cos) orders by cosine similarity
    assert torch.argmax(alpha, dim=1).tolist() == [0, 1, 2, 3]  # cos(e_i, e_i) = 1 is the largest
    flatter = mixing_weights(embeddings, scale=1.0)
    assert flatter[0, 0] < alpha[0, 0]  # a smaller τ spreads the weight


def test_proxy_graph_is_fixed_by_its_seed():
    params = FedPubParams()
    cpu = torch.device("cpu")
    a, b, c = proxy_graph(16, params, 0, cpu), proxy_graph(16, params, 0, cpu), proxy_graph(16, params, 1, cpu)
    assert torch.equal(a["x"], b["x"]) and torch.equal(a["edge_index"], b["edge_index"])
    assert not torch.equal(a["x"], c["x"])
    assert a["edge_index"].shape != c["edge_index"].shape or not torch.equal(a["edge_index"], c["edge_index"])
    assert a["x"].shape == (500, 16)
    src, dst = a["edge_index"]
    assert torch.equal(src // 100, dst // 100)  # p_out = 0: no edge between the 5 blocks
    density = a["edge_index"].shape[1] / (5 * 100 * 99)  # both directions over ordered pairs within blocks
    assert 0.08 < density < 0.12  # p_in = 0.1


def test_masked_gcn_with_unit_masks_is_the_gcn_and_prunes_in_eval(tiny_federation, cpu):
    graph = tiny_federation.on_device("masked_gcn", cpu)[0]
    torch.manual_seed(0)
    plain = GCN(tiny_federation.num_features, 16, tiny_federation.num_classes, 0.5)
    torch.manual_seed(0)
    masked = MaskedGCN(tiny_federation.num_features, 16, tiny_federation.num_classes, 0.5)
    plain.eval(), masked.eval()
    assert torch.equal(plain(graph), masked(graph))
    with torch.no_grad():
        masked.conv1.mask[:, :3] = 5e-4  # below the threshold 1e-3: pruned in eval mode
        plain.conv1.lin.weight[:, :3] = 0.0
        masked.classifier.mask[0] = -2.0
        plain.classifier.weight[0] *= -2.0
    torch.testing.assert_close(plain(graph), masked(graph))
    masked.train(), plain.train()
    torch.manual_seed(1)
    train_masked = masked(graph)
    torch.manual_seed(1)
    assert not torch.allclose(train_masked, plain(graph))  # in train mode the small masks still count


def test_masks_never_leave_the_client(tiny_federation, cpu, monkeypatch):
    uploaded_keys: list[str] = []
    clients: list[FedPubClient] = []

    class Recording(FedPubClient):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            clients.append(self)

        def fit(self, rnd, message):
            upload = super().fit(rnd, message)
            uploaded_keys.extend(_leaf_keys(upload))
            return upload

    monkeypatch.setattr(FedPub, "client", Recording)
    record = _run(tiny_federation, cpu, rounds=3)
    assert uploaded_keys and not any("mask" in key for key in uploaded_keys)
    assert any(key.endswith("lin.weight") for key in uploaded_keys)
    masks = [c.model.conv2.mask.detach() for c in clients]
    assert not torch.equal(masks[0], torch.ones_like(masks[0]))  # trained locally ...
    assert not torch.equal(masks[0], masks[1])  # ... and personal: no client ever loads another's
    weights_only = sum(v.numel() * 4 for k, v in clients[0].model.state_dict().items() if not k.endswith("mask"))
    assert record["bytes_up"][0] == 5 * (weights_only + 4 * clients[0].params.hidden)  # weights + embedding


def _leaf_keys(message, prefix=""):
    for key, value in message.items():
        if isinstance(value, dict):
            yield from _leaf_keys(value, f"{prefix}{key}/")
        else:
            yield f"{prefix}{key}"


def test_regularisers_act_only_in_the_papers_mode(tiny_federation, cpu):
    code = _run(tiny_federation, cpu, regularizer_grad=False)
    unregularised = _run(tiny_federation, cpu, l1=0.0, loc_l2=0.0)
    paper = _run(tiny_federation, cpu)
    # the mixing weights follow every parameter through the functional embeddings
    assert code["diagnostics"] == unregularised["diagnostics"]  # the official terms have no gradient
    assert code["curves"] == unregularised["curves"]
    assert paper["diagnostics"] != code["diagnostics"]


def test_runs_are_deterministic_and_personalised(tiny_federation, cpu):
    a = _run(tiny_federation, cpu, seed=3)
    b = _run(tiny_federation, cpu, seed=3)
    c = _run(tiny_federation, cpu, seed=4)
    assert a["curves"] == b["curves"] and a["diagnostics"] == b["diagnostics"]
    assert a["curves"] != c["curves"]
    self_weight = a["diagnostics"]["self_weight"]
    assert all(1 / 5 < w < 1 for w in self_weight)  # neither uniform nor purely local mixing
