"""The supervised local step most methods share: full-batch Adam on the client's training nodes."""

from __future__ import annotations

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
    Subclasses add terms to `loss`.
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

    def fit(self, rnd: Round, message: Message) -> Message:
        """Receive, train `local_epochs` steps, upload. The batched path (gfl_bench/batched.py) calls the
        same three steps, with the training of every client done at once."""
        self.receive(rnd, message)
        self.train_local()
        return self.upload()

    def loss(self) -> Tensor:
        """The local objective of one step; the base is cross-entropy on the training nodes."""
        logits = self.model(self.graph)
        return F.cross_entropy(logits[self.train_index], self.graph.y[self.train_index])

    def train_local(self) -> None:
        """`local_epochs` optimiser steps on the whole local graph; a client without labels only waits."""
        if self.num_train == 0:
            return
        self.model.train()
        for _ in range(self.setup.local_epochs):
            self.optimizer.zero_grad(set_to_none=True)
            self.loss().backward()
            self.optimizer.step()
