"""FED-PUB: row-stochastic similarity mixing, a seeded proxy graph, masks that never leave the client,
regularisers that act only in the paper's mode; checked directly and through the real runner."""

from __future__ import annotations

import pytest
import torch
from parties import build_parties

from gflbench.backbones import GCN
from gflbench.baselines.fedpub import FedPub, FedPubClient, FedPubParams, MaskedGCN, mixing_weights, proxy_graph
from gflbench.experiments.runner import run
from gflbench.experiments.spec import make_spec


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
    graph = tiny_federation.on_device(FedPubParams(), cpu)[0]
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("below", [1e-3, 0.37, 0.0, 1e-50])
def test_pruned_mask_is_the_masked_fill_bit_for_bit(dtype, below):
    """The one-pass pruning equals M.masked_fill(|M| < threshold, 0) on every entry, the threshold's
    own value and its neighbours, signed zeros, NaN and infinities included."""
    model = MaskedGCN(4, 3, 2, 0.0)
    model.prune_below = below
    at = torch.tensor(below, dtype=dtype)
    edges = torch.stack([at, torch.nextafter(at, torch.zeros_like(at)), torch.nextafter(at, torch.ones_like(at) * 2)])
    special = torch.tensor([0.0, -0.0, float("nan"), float("inf"), -float("inf")], dtype=dtype)
    mask = torch.cat(
        [
            edges,
            -edges,
            special,
            torch.randn(10_000, dtype=dtype, generator=torch.Generator().manual_seed(3)) * max(below, 1e-3) * 2,
        ]
    )
    expected = mask.masked_fill(mask.abs() < below, 0.0)
    pruned = model.pruned(mask)
    assert torch.equal(pruned.isnan(), expected.isnan())
    assert torch.equal(pruned.nan_to_num(7.0), expected.nan_to_num(7.0))
    assert int((pruned == 0).sum()) > 5 or below < 1e-3  # the comparison saw pruned entries


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
    paper = _run(tiny_federation, cpu, regularizer_grad=True)
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


def test_mask_weight_decay_switch_changes_which_parameters_decay(tiny_federation):
    def decay_by_name(**switch):
        params = FedPubParams(weight_decay=5e-4, **switch)
        _, clients = build_parties(FedPub, params, tiny_federation, rounds=1)
        optimizer = clients[0].optimizer
        decay = {id(p): group["weight_decay"] for group in optimizer.param_groups for p in group["params"]}
        named = dict(clients[0].model.named_parameters())
        assert set(decay) == {id(p) for p in named.values()}  # every parameter is optimised, once
        return {name: decay[id(p)] for name, p in named.items()}

    code = decay_by_name()  # default: the released code's Adam, weight decay on every parameter
    assert FedPubParams().mask_weight_decay
    assert set(code.values()) == {5e-4}
    exempt = decay_by_name(mask_weight_decay=False)
    masks = {name for name in exempt if name.endswith("mask")}
    assert masks == {"conv1.mask", "conv2.mask", "classifier.mask"}
    assert all(exempt[name] == 0.0 for name in masks)
    assert all(value == 5e-4 for name, value in exempt.items() if name not in masks)


def test_decayed_masks_step_down_by_lr_whatever_their_gradient(tiny_federation):
    # Adam normalises the step: where weight_decay * |M| dominates the CE gradient, as on Cora's row-normalised
    # features at 5e-4 (docs/baselines/fedpub.md), every mask entry falls by lr per step
    def masks_after_two_steps(**switch):
        params = FedPubParams(weight_decay=0.5, **switch)
        _, clients = build_parties(FedPub, params, tiny_federation, rounds=1)
        clients[0].train_local()
        clients[0].train_local()
        return torch.cat([p.detach().view(-1) for n, p in clients[0].model.named_parameters() if n.endswith("mask")])

    decayed = masks_after_two_steps()
    torch.testing.assert_close(decayed, torch.full_like(decayed, 1 - 2 * 0.01), atol=1e-4, rtol=0)
    exempt = masks_after_two_steps(mask_weight_decay=False)
    assert 0.2 < (exempt > 1).float().mean() < 0.8  # moved by the CE gradient's sign, up or down
