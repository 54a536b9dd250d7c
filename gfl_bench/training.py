"""The supervised local step most methods share: full-batch Adam on the client's training nodes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F
from torch_geometric.data import Data

from gfl_bench.backbones import Backbone
from gfl_bench.method import Client, Message, MethodParams, Round, Setup


class TrainingClient(Client):
    """A client that trains its model with cross-entropy for `local_epochs` full-batch steps per round.

    The Adam optimiser is created once and kept across rounds (protocol §1.2); loading received
    weights copies them into the same parameter tensors, so its moments carry over as in FED-PUB.
    Subclasses add terms of the parameters alone to `penalty` (the batched path adds them too), and
    other terms to `loss`.
    """

    def __init__(self, cid: int, graph: Data, model: Backbone, params: MethodParams, setup: Setup) -> None:
        super().__init__(cid, graph, model, params, setup)
        self.optimizer = torch.optim.Adam(model.parameters(), lr=params.lr, weight_decay=params.weight_decay)
        self.train_index = graph.train_mask.nonzero().view(-1)
        self.num_train = int(self.train_index.numel())

    def receive(self, rnd: Round, message: Message) -> None:
        """Take in the server's message before local training (default: nothing to take in)."""

    def upload(self) -> Message:
        """What leaves the client after local training (default: nothing)."""
        return {}

    def trains_locally(self, rnd: Round) -> bool:
        """Whether this stage's `fit` is `receive`, `train_local`, `upload`, which the batched path
        (gfl_bench/batched.py) may run for all clients at once; default: every stage. The batched path
        packs the clients' graphs at the first stage where all of them say so, so a client's graph must
        not change after that (FedSage+ says no until it has mended its graph)."""
        return True

    def fit(self, rnd: Round, message: Message) -> Message:
        """Receive, train `local_epochs` steps, upload. The batched path (gfl_bench/batched.py) calls the
        same three steps, with the training of every client done at once."""
        self.receive(rnd, message)
        self.train_local()
        return self.upload()

    def loss(self) -> Tensor:
        """One step's local objective: `objective` on one forward pass, plus `penalty`."""
        return self.with_penalty(self.objective(self.model(self.graph)), dict(self.model.named_parameters()))

    def objective(self, logits: Tensor, representations: Any = None) -> Tensor:
        """The data term of the local objective given this step's logits: cross-entropy on the training
        nodes. The batched path calls it with this client's slice of a batched forward, and for
        backbones that expose them (H2GCN), its `representations`, which FedGMC's losses read."""
        return F.cross_entropy(logits[self.train_index], self.graph.y[self.train_index])

    @classmethod
    def solve_together(cls, clients: Sequence[TrainingClient], representations: Sequence[Any]) -> None:
        """Solve, for the clients of one run at once, what each client's `objective` would otherwise solve
        alone: a constant of the objective held for the round (FedGMC's Sinkhorn plans). The batched
        path calls it before the clients' objectives, with each client's slice of the representations;
        an override must leave every client as its own objective would have. Default: nothing to solve."""

    def with_penalty(self, loss: Tensor, parameters: Mapping[str, Tensor]) -> Tensor:
        """`loss` plus this client's `penalty` of `parameters`, if it has one."""
        penalty = self.penalty(parameters)
        return loss if penalty is None else loss + penalty

    def penalty(self, parameters: Mapping[str, Tensor]) -> Tensor | None:
        """A term of the local objective that depends on the client's parameters only (FedProx's proximal
        term), given by name as `named_parameters()` holds them. The batched path calls it through
        `penalty_together`, with the client's slices of the stacked parameters. Default: none."""
        return None

    @classmethod
    def penalty_together(cls, clients: Sequence[TrainingClient], parameters: Mapping[str, Tensor]) -> Tensor | None:
        """Σ_m `clients[m].penalty` of its own parameters, for the batched path: `parameters[name]` stacks
        every client's parameter `name` along a leading client axis, in the `named_parameters()` layout.

        Default: each client's `penalty` of its slice. An override computes the same sum on the stacks
        (one operation per parameter instead of one per client and parameter: FedProx's proximal term
        cost a Cora-20 batched round as much as the rest of its local training); each client's gradient
        must stay its own penalty's gradient."""
        if cls.penalty is TrainingClient.penalty:
            return None
        slices = {name: stack.unbind(0) for name, stack in parameters.items()}  # one backward `stack` per parameter
        terms = [c.penalty({name: parts[m] for name, parts in slices.items()}) for m, c in enumerate(clients)]
        terms = [term for term in terms if term is not None]
        return sum(terms) if terms else None

    def train_local(self) -> None:
        """`local_epochs` optimiser steps on the whole local graph; a client without labels only waits."""
        if self.num_train == 0:
            return
        self.model.train()
        for _ in range(self.setup.local_epochs):
            self.optimizer.zero_grad(set_to_none=True)
            self.loss().backward()
            self.optimizer.step()
