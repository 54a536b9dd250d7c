"""FedPer (Arivazhagan et al., 2019): the base layers are federated, the classifier stays local.

Per round the server sends the averaged base layers; each client loads them into its model, keeps
its own classification head, trains everything and uploads the base layers only. For the 2-layer GCN
+ classifier (paper B.6) the base is conv1 and conv2 and the head is the final Linear (FedIIH
appendix I.5, research notes §2.4). All clients start from one initial model, so the base layers
agree at round 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gflbench.baselines.fedavg import FedAvgClient, FedAvgParams, FedAvgServer
from gflbench.core.aggregation import model_state
from gflbench.core.method import Method


@dataclass(frozen=True)
class FedPerParams(FedAvgParams):
    backbone: str = "gcn"


class FedPerClient(FedAvgClient):
    def shared_state(self) -> dict[str, torch.Tensor]:
        return model_state(self.model, exclude_prefix=self.model.head)


class FedPerServer(FedAvgServer):
    def initial_weights(self) -> dict[str, torch.Tensor]:
        return model_state(self.model, exclude_prefix=self.model.head)

    def global_model(self, cid: int) -> None:
        """None: the shared layers are global, but every head stays on its client (no whole global model)."""
        return None


class FedPer(Method):
    name = "fedper"
    title = "FedPer"
    summary = "base layers averaged as in FedAvg; the classification head never leaves the client"
    Params = FedPerParams
    client = FedPerClient
    server = FedPerServer
