"""FedAvg (McMahan et al., AISTATS 2017): clients train the broadcast model, the server averages.

Algorithm, per round: the server sends the global weights; each client loads them, trains
`local_epochs` full-batch steps and uploads its weights with its number of training nodes; the
server sets the global weights to the weighted mean.

Defaults are FED-PUB's code, which produced the paper's FedAvg row (docs/protocol.md): the 2-layer
GCN + classifier and the plain mean over clients (`weighting=uniform`; FED-PUB's `train_size` is the
length of a one-element list, research notes §2.2). `weighting=train` weights by training nodes as
in the FedAvg paper; paper B.6's "FedAvg shares FedGMC's backbone" is `--set backbone=h2gcn-tanh`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from gflbench.core.aggregation import client_weights, load_model_state, model_state, weighted_mean
from gflbench.core.method import (
    BACKBONE_SEARCH_SPACE,
    SHARED_SEARCH_SPACE,
    Message,
    Method,
    MethodParams,
    Round,
    Server,
)
from gflbench.core.training import TrainingClient
from gflbench.errors import UserError

WEIGHTINGS = ("train", "uniform")


@dataclass(frozen=True)
class FedAvgParams(MethodParams):
    search_space = {**SHARED_SEARCH_SPACE, **BACKBONE_SEARCH_SPACE}

    backbone: str = "gcn"  # FED-PUB's 2-layer GCN + classifier
    weighting: str = "uniform"  # "uniform": plain mean (FED-PUB code); "train": by training-node count (McMahan)

    def __post_init__(self) -> None:
        if self.weighting not in WEIGHTINGS:
            raise UserError(f"weighting must be one of {', '.join(WEIGHTINGS)}, got {self.weighting!r}")


class FedAvgClient(TrainingClient):
    """Loads the received weights, trains, uploads the shared part of its model."""

    def shared_state(self) -> dict[str, torch.Tensor]:
        """What this client uploads: the whole model (FedPer keeps its head back)."""
        return model_state(self.model)

    def receive(self, rnd: Round, message: Message) -> None:
        load_model_state(self.model, message["weights"])

    def upload(self) -> Message:
        return {"weights": self.shared_state(), "num_train": torch.tensor(self.num_train)}


class FedAvgServer(Server):
    """Holds the global weights; sends them to every client; replaces them by the clients' mean."""

    def __init__(self, model, params: FedAvgParams, setup) -> None:
        super().__init__(model, params, setup)
        self.global_weights = self.initial_weights()

    def initial_weights(self) -> dict[str, torch.Tensor]:
        return model_state(self.model)

    def configure(self, rnd: Round, client_ids: list[int]) -> dict[int, Message]:
        return {cid: {"weights": self.global_weights} for cid in client_ids}

    def aggregate(self, rnd: Round, uploads: Mapping[int, Message]) -> None:
        states = [u["weights"] for u in uploads.values()]
        self.global_weights = weighted_mean(states, client_weights(uploads, self.params.weighting))

    def global_model(self, cid: int) -> dict[str, torch.Tensor] | None:
        """The one global model every client starts its next round from."""
        return self.global_weights


class FedAvg(Method):
    name = "fedavg"
    title = "FedAvg"
    summary = "whole model up and down; server takes the mean of the client models"
    Params = FedAvgParams
    client = FedAvgClient
    server = FedAvgServer
