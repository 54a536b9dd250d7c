"""FedProx (Li et al., MLSys 2020): FedAvg whose local objective adds a proximal term.

Local loss = CE + (mu/2) * ||theta - theta_global||^2, where theta_global are the weights received
at the start of the round (squared norm, as in the FedProx paper, OpenFGL and the GCFL repo; research
notes §2.3). Default mu = 0.01 (GCFL repo; the FedProx paper searches {0.001, 0.01, 0.1, 1}).
Backbone: the 2-layer GCN + classifier (paper B.6).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from torch import Tensor

from gflbench.baselines.fedavg import FedAvgClient, FedAvgParams, FedAvgServer
from gflbench.core.method import Message, Method, MethodParams, Round, log_range, non_negative
from gflbench.core.training import squared_distance


@dataclass(frozen=True)
class FedProxParams(FedAvgParams):
    search_space = {**FedAvgParams.search_space, "mu": log_range(1e-3, 1.0)}  # the FedProx paper's grid's span

    bounds = {"mu": non_negative()}

    backbone: str = "gcn"
    mu: float = 0.01


class FedProxClient(FedAvgClient):
    def receive(self, rnd: Round, message: Message) -> None:
        self.reference = message["weights"]  # θ_global, the anchor of this round's proximal term
        super().receive(rnd, message)

    @classmethod
    def penalty(cls, params: MethodParams, parameters: Mapping[str, Tensor], reference: Mapping[str, Tensor]) -> Tensor:
        """(mu/2) ||θ - θ_global||², over the parameters the server sent."""
        proximal = sum(
            squared_distance(param, reference[name]) for name, param in parameters.items() if name in reference
        )
        return 0.5 * cast(FedProxParams, params).mu * proximal


class FedProx(Method):
    name = "fedprox"
    title = "FedProx"
    summary = "as FedAvg, plus a proximal term to the received weights in the local loss"
    Params = FedProxParams
    client = FedProxClient
    server = FedAvgServer

    @classmethod
    def equivalent(cls, params: FedProxParams, scheme: str, local_epochs: int) -> tuple[str, dict] | None:
        """One local step starts at the received weights, where the proximal gradient mu(θ - θ_global) is zero."""
        if local_epochs != 1:
            return None
        values = dataclasses.asdict(params)
        values.pop("mu")
        return "fedavg", values
