"""FedSage+: the mended graph, the greedy and cross-client feature losses, what crosses the wire."""

from __future__ import annotations

import pytest
import torch
from parties import build_parties

from gflbench.baselines.fedsage import (
    FedSagePlus,
    generator_stages,
    greedy_feature_loss,
    impair,
    nearest_feature_gradient,
    slot_counts,
)
from gflbench.core.exchange import clone_message
from gflbench.core.method import Round, resolve_params
from gflbench.experiments.runner import run
from gflbench.experiments.spec import make_spec

FAST = {"local_gen_epochs": "10", "fed_gen_epochs": "3"}  # fewer generator epochs: a fast file, same exchanges


def drive(federation, rounds: int = 1, **overrides):
    """Run FedSage+'s parties by hand; return the clients and every exchange's (round, downloads, uploads)."""
    params = resolve_params(FedSagePlus, {**FAST, **overrides})
    server, clients = build_parties(FedSagePlus, params, federation, rounds)
    exchanges = []
    for index in range(rounds):
        for stage in range(server.stages(index)):
            rnd = Round(index, stage)
            downloads = server.configure(rnd, list(range(len(clients))))
            uploads = {c.cid: clone_message(c.fit(rnd, clone_message(downloads[c.cid])[0]))[0] for c in clients}
            exchanges.append((rnd, downloads, uploads))
            server.aggregate(rnd, uploads)
    return clients, exchanges, params


@pytest.fixture(scope="module")
def driven(tiny_federation):
    return drive(tiny_federation)


def test_mended_graph_has_the_predicted_number_of_generated_neighbours(driven, tiny_federation):
    clients, _, params = driven
    generated_total = 0
    for client, original in zip(clients, tiny_federation.graphs):
        g, n = client.graph, original.num_nodes
        slots = slot_counts(client.missing_degree, params.num_pred)
        assert torch.equal(slots, client.missing_degree.floor().clamp(0, params.num_pred).long())
        assert g.num_nodes == n + int(slots.sum())
        src, dst = g.edge_index
        links = (src < n) & (dst >= n)
        assert torch.equal(torch.bincount(src[links], minlength=n), slots)  # ⌊ñ_v⌋ ≤ P new neighbours of v
        assert (torch.bincount(dst[dst >= n] - n, minlength=g.num_nodes - n) == 1).all()  # one edge into each
        assert not ((src >= n) & (dst >= n)).any()  # generated nodes hang off their anchor only
        assert torch.equal(g.x[:n], original.x) and torch.equal(g.y[:n], original.y)
        for mask in ("train_mask", "val_mask", "test_mask"):
            assert torch.equal(getattr(g, mask)[:n], getattr(original, mask)) and not getattr(g, mask)[n:].any()
        assert (g.y[n:] == -1).all() and (g.global_id[n:] == -1).all()
        assert client.predict().shape == (g.num_nodes, tiny_federation.num_classes)  # evaluated on the mended graph
        generated_total += g.num_nodes - n
    assert generated_total > 0  # the test would be empty if no node got a generated neighbour


def test_what_crosses_the_wire_in_the_generator_phase(driven):
    clients, exchanges, params = driven
    stages = generator_stages(params)
    assert [r for r, _, _ in exchanges] == [Round(0, s) for s in range(stages + 1)]
    num_train = {c.cid: c.num_train for c in clients}
    for rnd, downloads, uploads in exchanges[:stages]:
        if rnd.stage % 2 == 0 and rnd.stage < stages - 1:  # generated vectors of training nodes' slots
            for cid, up in uploads.items():
                assert set(up) == {"generated"}
                assert up["generated"].shape[0] <= num_train[cid] * params.num_pred
            sent = uploads
        elif rnd.stage % 2 == 1:  # every other client's vectors relayed, and gradients for each back
            for j, down in downloads.items():
                assert set(down["generated"]) == {str(i) for i in sent if i != j}
                for i, g in down["generated"].items():
                    assert torch.equal(g, sent[int(i)]["generated"])
                    assert uploads[j]["gradients"][i].shape == g.shape
            returned = uploads
        elif rnd.stage > 0:  # each client gets the sum of the gradients returned for its vectors
            for i, down in downloads.items():
                total = sum(returned[j]["gradients"][str(i)] for j in returned if j != i)
                assert torch.allclose(down["gradient"], total)
        assert not any("weights" in u for u in uploads.values())  # no classifier weights in phase 1
    assert "weights" in exchanges[stages][1][0]  # round 0 ends with the first FedAvg exchange
    assert any(u["generated"].numel() > 0 for _, _, ups in exchanges[2 : stages - 1 : 2] for u in ups.values())


def test_greedy_loss_matches_each_slot_to_its_closest_true_neighbour():
    generated = torch.tensor([[[0.0, 0.0], [1.0, 1.0], [5.0, 5.0]]])  # one node, P = 3
    targets = torch.tensor([[[1.0, 1.0], [0.0, 2.0], [9.0, 9.0]]])  # third row is padding (2 true neighbours)
    loss = greedy_feature_loss(generated, torch.tensor([2]), targets, torch.tensor([2]))
    # slot 0: min(mse to (1,1) = 1, to (0,2) = 2) = 1; slot 1: 0; slot 2 not generated (⌊ñ⌋ = 2)
    assert loss.item() == pytest.approx(1.0)
    assert greedy_feature_loss(generated, torch.tensor([3]), targets, torch.tensor([0])).item() == 0.0


def test_returned_gradient_is_that_of_the_nearest_real_feature_distance():
    torch.manual_seed(1)
    generated = torch.randn(7, 4, requires_grad=True)
    features = torch.randn(11, 4)
    loss = torch.cdist(generated, features).pow(2).min(dim=1).values.sum() / 4
    (expected,) = torch.autograd.grad(loss, generated)
    assert torch.allclose(nearest_feature_gradient(generated.detach(), features), expected, atol=1e-5)


def test_the_returned_gradients_train_the_generator(tiny_federation, driven, monkeypatch):
    import gflbench.baselines.fedsage

    monkeypatch.setattr(gflbench.baselines.fedsage, "nearest_feature_gradient", lambda g, features: torch.zeros_like(g))
    silent, _, _ = drive(tiny_federation)  # same run, but the other clients send zero gradients
    changed = [not torch.equal(a.graph.x, b.graph.x) for a, b in zip(driven[0], silent)]
    assert any(changed)


def test_without_federated_epochs_the_client_mends_right_after_pretraining(tiny_federation):
    clients, exchanges, _ = drive(tiny_federation, fed_gen_epochs="0")
    assert [r for r, _, _ in exchanges] == [Round(0, 0), Round(0, 1)]
    assert all(u == {} for u in exchanges[0][2].values())  # nothing leaves a client in local pretraining
    assert all(
        c.graph.num_nodes == g.num_nodes + int(slot_counts(c.missing_degree, 5).sum())
        for c, g in zip(clients, tiny_federation.graphs)
    )


def test_impaired_graph_hides_validation_nodes_only(tiny_federation):
    graph = tiny_federation.graphs[0]
    train = graph.train_mask.nonzero().view(-1)
    torch.manual_seed(0)
    impaired = impair(graph, train, 0.5, 5)
    hidden = graph.num_nodes - impaired.x.shape[0]
    assert hidden == int(0.5 * int(graph.val_mask.sum()))
    assert torch.equal(impaired.y[impaired.train], graph.y[train])
    assert impaired.missing.sum() > 0 and impaired.targets.shape == (train.numel(), 5, graph.x.shape[1])


def test_runs_are_deterministic_per_seed(tiny_federation, cpu):
    def once(seed):
        spec = make_spec("fedsage+", "tiny", "metis", 5, seed, FAST, rounds=3)
        return run(spec, tiny_federation, cpu)

    a, b, c = once(3), once(3), once(4)
    assert a["curves"] == b["curves"] and a["curves"] != c["curves"]
    assert a["bytes_up"][0] > a["bytes_up"][1]  # round 0 carries the generator phase
