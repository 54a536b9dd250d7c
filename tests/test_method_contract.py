"""The Method contract's own promises (gfl_bench/core/method.py, gfl_bench/core/training.py), hook by hook."""

from __future__ import annotations

import pytest
import torch
from parties import build_parties

from gflbench.core.method import Method, Round, Server, all_methods, method_class, resolve_params
from gflbench.core.training import TrainingClient, squared_distance


@pytest.mark.parametrize(
    ("method", "overrides"), [("fedprox", {"mu": "0.5"}), ("fedpub", {"regularizer_grad": "true", "l1": "0.01"})]
)
def test_the_penalty_on_stacked_parameters_is_the_sum_of_each_clients_own(tiny_federation, cpu, method, overrides):
    """`penalty` on every client's parameters stacked (the batched executor) gives the sum of each client's
    penalty on its own one-client stack (the per-client executor), and to each slice that client's gradient."""
    cls = method_class(method)
    server, clients = build_parties(cls, resolve_params(cls, overrides), tiny_federation, 2, cpu)
    for rnd in (Round(0), Round(1)):  # FED-PUB's anchor term starts at round 1
        for cid, message in server.configure(rnd, list(range(len(clients)))).items():
            clients[cid].receive(rnd, message)
    assert all(client.reference for client in clients)
    generator = torch.Generator().manual_seed(0)
    names = [name for name, _ in clients[0].model.named_parameters()]
    shapes = {name: clients[0].model.get_parameter(name).shape for name in names}
    stacks = {n: torch.randn(len(clients), *shapes[n], generator=generator, requires_grad=True) for n in names}
    reference = {n: torch.stack([c.reference[n] for c in clients]) for n in clients[0].reference}
    together = cls.client.penalty(clients[0].params, stacks, reference)
    together.backward()
    own = [{n: stacks[n].detach()[m].clone().requires_grad_() for n in names} for m in range(len(clients))]
    terms = [
        cls.client.penalty(
            c.params, {n: p[None] for n, p in mine.items()}, {n: r[None] for n, r in c.reference.items()}
        )
        for c, mine in zip(clients, own)
    ]
    one_by_one = sum(terms)
    one_by_one.backward()
    torch.testing.assert_close(together, one_by_one)
    assert together.item() > 0 and all(term.item() > 0 for term in terms)
    for m, mine in enumerate(own):
        for name in names:
            torch.testing.assert_close(stacks[name].grad[m], mine[name].grad)


def test_squared_distance_is_autograds_bit_for_bit():
    """The memory-lean squared distance gives autograd's value and gradient exactly (per-client numbers)."""
    generator = torch.Generator().manual_seed(1)
    weights, reference = torch.randn(2, 3, 64, 33, generator=generator).unbind(0)
    ours, theirs = weights.clone().requires_grad_(), weights.clone().requires_grad_()
    lean, plain = 0.5 * 0.3 * squared_distance(ours, reference), 0.5 * 0.3 * (theirs - reference).pow(2).sum()
    (lean * 1.7).backward()
    (plain * 1.7).backward()
    assert torch.equal(lean, plain) and torch.equal(ours.grad, theirs.grad)


def test_batchability_is_derived_from_the_hooks_a_client_overrides():
    """The batched executor calls receive, objective, penalty, group_step and upload; a client that
    replaces the step itself (fit without trains_locally, loss, train_local, predict) cannot batch."""

    class Plain(TrainingClient):
        def receive(self, rnd, message):
            pass

    class OwnFit(TrainingClient):
        def fit(self, rnd, message):
            return {}

    class OwnFitSomeStages(OwnFit):
        def trains_locally(self, rnd):
            return rnd.index > 0

    class OwnLoss(TrainingClient):
        def loss(self):
            return torch.zeros(())

    class OwnTraining(TrainingClient):
        def train_local(self):
            pass

    class OwnPrediction(TrainingClient):
        def predict(self):
            return torch.zeros(())

    verdicts = {
        kind.__name__: kind._batches()
        for kind in (Plain, OwnFit, OwnFitSomeStages, OwnLoss, OwnTraining, OwnPrediction)
    }
    assert verdicts == {
        "Plain": True, "OwnFit": False, "OwnFitSomeStages": True, "OwnLoss": False, "OwnTraining": False,
        "OwnPrediction": False,
    }  # fmt: skip

    def registered(client: type) -> type[Method]:
        return type(
            "Registered", (Method,), {"name": "x", "title": "x", "summary": "x", "client": client, "server": Server}
        )

    assert registered(Plain).batchable and not registered(OwnFit).batchable
    with pytest.raises(TypeError, match="derived"):
        type("Declared", (Method,), {"client": Plain, "server": Server, "batchable": True})
    # the project's own methods: those that replace their local step run per client
    assert {m for m, c in all_methods().items() if not c.batchable} >= {"fedgta", "fediih", "fedici", "adafgl"}
    assert {m for m, c in all_methods().items() if c.batchable} >= {"fedavg", "fedprox", "fedpub", "fedgmc", "fedsage+"}
