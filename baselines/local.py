"""Local: every client trains on its own subgraph and nothing is exchanged (paper B.5).

Default backbone FedGMC's (H2GCN, tanh ego activation): paper B.6 gives Local "the identical GNN
backbone ... as the one used in FedGMC". Training runs on the same round schedule as the federated methods, so the best-validation-
round rule selects over the same checkpoints (protocol §1.3; research notes §2.1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gfl_bench.backbones import FEDGMC_BACKBONE
from gfl_bench.method import Message, Method, MethodParams, Round, Server, register
from gfl_bench.training import TrainingClient


@dataclass(frozen=True)
class LocalParams(MethodParams):
    backbone: str = FEDGMC_BACKBONE


class LocalClient(TrainingClient):
    def fit(self, rnd: Round, message: Message) -> Message:
        self.train_local()
        return {}


class LocalServer(Server):
    def configure(self, rnd: Round, client_ids: list[int]) -> dict[int, Message]:
        return {cid: {} for cid in client_ids}

    def aggregate(self, rnd: Round, uploads: Mapping[int, Message]) -> None:
        """Nothing arrives and nothing is kept."""


@register
class Local(Method):
    name = "local"
    title = "Local"
    summary = "no communication; each client trains alone"
    Params = LocalParams
    client = LocalClient
    server = LocalServer
