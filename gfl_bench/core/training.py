"""The supervised local step most methods share: full-batch Adam on the client's training nodes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F
from torch_geometric.data import Data

from gflbench.backbones import Backbone
from gflbench.core.method import Client, Message, MethodParams, Round, Setup


class TrainingClient(Client):
    """A client that trains its model for `local_epochs` full-batch Adam steps per round.

    `fit` is `receive`, `train_local`, `upload`. One local step minimises

        objective(logits, representations) + penalty(params, θ, reference)

    the data term on this client's own forward pass, plus a term of its parameters θ alone. The data
    term is always one client's; the penalty is written on tensors that may stack several clients
    (a leading client axis, 1 on the per-client path), so the batched executor computes every
    client's penalty in one operation per parameter. What a round holds fixed for all of a run's
    clients may be solved for them at once in `group_step`.

    Whether a method's clients may be trained together (`Method.batchable`) is derived from which of
    these hooks its client overrides (`_batches`), never declared.

    The Adam optimiser is created once and kept across rounds (protocol §1.2); loading received
    weights copies them into the same parameter tensors, so its moments carry over as in FED-PUB.
    """

    def __init__(self, cid: int, graph: Data, model: Backbone, params: MethodParams, setup: Setup) -> None:
        super().__init__(cid, graph, model, params, setup)
        self.optimizer = torch.optim.Adam(model.parameters(), lr=params.lr, weight_decay=params.weight_decay)
        self.train_index = graph.train_mask.nonzero().view(-1)
        self.num_train = int(self.train_index.numel())
        # What `penalty` compares the parameters with, by parameter name (FedProx, FED-PUB: the weights
        # received this round); set in `receive`. Empty: nothing to compare with this round.
        self.reference: dict[str, Tensor] = {}

    def receive(self, rnd: Round, message: Message) -> None:
        """Take in the server's message before local training; default: nothing to take in.

        Called by both executors (gfl_bench/core/exchange.py) once per exchange, clients in id order, with
        this client's own copy of `configure`'s entry for it: the client may keep or change its tensors.
        An override sets here whatever the round's local step reads (weights, `reference`, targets)."""

    def upload(self) -> Message:
        """What leaves the client after local training; default: nothing.

        Called by both executors once per exchange, clients in id order, right after this client's
        local training (the batched one: after every client's). The message is cloned and counted
        when it leaves, so it may hold the model's own tensors. Tensors only (dicts, lists, tuples)."""
        return {}

    def trains_locally(self, rnd: Round) -> bool:
        """Whether this stage's `fit` is `receive`, `train_local`, `upload`; default: every stage.

        Asked by the runner of every client before each exchange when the batched executor may run.
        Where all say yes, it runs them together (gfl_bench/core/batched.py); it packs the clients' graphs
        at the first such stage, so a client's graph must not change after that (FedSage+ says no
        until it has mended its graph). A client that overrides `fit` is batchable only through this."""
        return True

    def fit(self, rnd: Round, message: Message) -> Message:
        """Receive, train `local_epochs` steps, upload.

        The per-client executor calls it; the batched one calls the same three steps itself, with the
        training of every client done at once, so an override makes the method run per client unless
        it also overrides `trains_locally` to say in which stages `fit` is exactly these steps."""
        self.receive(rnd, message)
        self.train_local()
        return self.upload()

    def loss(self) -> Tensor:
        """One local step's objective on the per-client path: `objective` on one forward pass, plus the
        penalty. The batched executor never calls it (it slices one batched forward per client), so an
        override makes the method run per client: a term of the forward's outputs belongs in `objective`."""
        return self._penalised(self.objective(*self.model.outputs(self.graph)))

    def objective(self, logits: Tensor, representations: Any = None) -> Tensor:
        """The data term of one local step given this client's logits: cross-entropy on its training nodes.

        Called once per local step by both executors, with this client's own logits `[N, C]` (the
        batched one: its unpadded slice of a batched forward), and, for backbones that expose them
        (H2GCN), its `representations`, which FedGMC's losses read; None for the others. State it
        keeps for its upload is its own."""
        return F.cross_entropy(logits[self.train_index], self.graph.y[self.train_index])

    @classmethod
    def penalty(
        cls, params: MethodParams, parameters: Mapping[str, Tensor], reference: Mapping[str, Tensor]
    ) -> Tensor | None:
        """A term of the local objective that depends on the parameters alone (FedProx's proximal term,
        FED-PUB's L1 and anchor terms), summed over the clients it is given; default: none.

        `parameters[name]` holds K clients' parameter `name` along a leading client axis, `[K, *shape]`
        with `shape` as in `named_parameters()`; `reference[name]` likewise each client's
        `self.reference[name]` (a name missing there: nothing to compare with). The per-client executor
        calls it every step with K = 1, the batched one with every client of the batch; each client's
        gradient must be its own term's. It sees no client object: what it reads is `reference`."""
        return None

    def _penalised(self, loss: Tensor) -> Tensor:
        """`loss` plus this client's `penalty`, on its parameters and `reference` as one-client stacks."""
        parameters = {name: parameter[None] for name, parameter in self.model.named_parameters()}
        penalty = self.penalty(self.params, parameters, {name: ref[None] for name, ref in self.reference.items()})
        return loss if penalty is None else loss + penalty

    @classmethod
    def group_step(cls, clients: Sequence[TrainingClient], representations: Sequence[Any]) -> None:
        """Solve at once, for one run's clients, what each client's `objective` would otherwise solve
        alone: constants of the objective held for the step or the round (FedGMC's Procrustes factors and
        Sinkhorn plans); default: nothing.

        Only the batched executor calls it, before each local step, once per run (clients in id order,
        `representations[i]` the i-th client's slice, as `objective` will get it). An override must
        leave every client as its own `objective` would have: it may only save work."""

    def train_local(self) -> None:
        """`local_epochs` optimiser steps on the whole local graph; a client without labels only waits."""
        if self.num_train == 0:
            return
        self.model.train()
        for _ in range(self.setup.local_epochs):
            self.optimizer.zero_grad(set_to_none=True)
            self.loss().backward()
            self.optimizer.step()

    @classmethod
    def _batches(cls) -> bool:
        """Whether the batched executor computes this client's local step: it calls `receive`, `objective`,
        `penalty`, `group_step` and `upload`, and scores one batched forward, so every other step hook must
        be TrainingClient's own (`loss`, `train_local`, `predict`), and `fit` be declared equal to those
        steps in the stages where it is (`trains_locally`)."""

        def own(hook: str) -> bool:
            return getattr(cls, hook) is not getattr(TrainingClient, hook)

        return (
            not own("train_local")
            and not own("predict")
            and (not own("fit") or own("trains_locally"))
            and not own("loss")
        )


def squared_distance(parameters: Tensor, reference: Tensor) -> Tensor:
    """||parameters - reference||², summed over every element, with the gradient 2 (parameters - reference).

    For penalties on stacked parameters: autograd's `(p - r).pow(2).sum()` keeps the difference for its
    backward, one more copy of every client's model, which put batched FedProx's peak memory above
    OpenFGL's; this recomputes it in the backward. Same values and gradient, bit for bit."""
    return _SquaredDistance.apply(parameters, reference)


class _SquaredDistance(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, parameters: Tensor, reference: Tensor) -> Tensor:
        ctx.save_for_backward(parameters, reference)
        return (parameters - reference).pow_(2).sum()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        parameters, reference = ctx.saved_tensors
        return (parameters - reference).mul_(2 * grad), None
