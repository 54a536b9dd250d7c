"""FedProx (Li et al., MLSys 2020): FedAvg whose local objective adds a proximal term.

Local loss = CE + (mu/2) * ||theta - theta_global||^2, where theta_global are the weights received
at the start of the round (squared norm, as in the FedProx paper, OpenFGL and the GCFL repo; research
notes §2.3). Default mu = 0.01 (GCFL repo; the FedProx paper searches {0.001, 0.01, 0.1, 1}).
Backbone: the 2-layer GCN + classifier (paper B.6).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from baselines.fedavg import FedAvgClient, FedAvgParams, FedAvgServer
from gfl_bench.method import Message, Method, Round, log_range, non_negative


@dataclass(frozen=True)
class FedProxParams(FedAvgParams):
    search_space = {**FedAvgParams.search_space, "mu": log_range(1e-3, 1.0)}  # the FedProx paper's grid's span

    bounds = {"mu": non_negative()}

    backbone: str = "gcn"
    mu: float = 0.01


class FedProxClient(FedAvgClient):
    def receive(self, rnd: Round, message: Message) -> None:
        self.anchor = message["weights"]
        super().receive(rnd, message)

    def penalty(self, parameters: Mapping[str, Tensor]) -> Tensor:
        """(mu/2) ||θ - θ_global||², over the parameters the server sent."""
        proximal = sum((param - self.anchor[name]).pow(2).sum() for name, param in parameters.items() if name in self.anchor)
        return 0.5 * self.params.mu * proximal

    @classmethod
    def penalty_together(cls, clients: Sequence[FedProxClient], parameters: Mapping[str, Tensor]) -> Tensor:
        """Σ_m (mu/2) ||θ_m - θ_global,m||² on the stacked parameters: one difference per parameter for all
        clients. The received weights are laid out in the stack's own memory order (the first layer's
        stack is input-major), which halves the term's cost against stacking them as received; each
        client's gradient is mu (θ_m - θ_global,m), as from its own `penalty`."""
        proximal = torch.zeros((), device=clients[0].setup.device)
        for name, stacked in parameters.items():
            if name not in clients[0].anchor:
                continue
            anchors = torch.empty_like(stacked)  # same strides as `stacked`
            for m, client in enumerate(clients):
                anchors[m].copy_(client.anchor[name])
            proximal = proximal + (stacked - anchors).pow(2).sum()  # not mse_loss: its CPU backward is 3x slower here
        return 0.5 * clients[0].params.mu * proximal


class FedProx(Method):
    name = "fedprox"
    title = "FedProx"
    summary = "as FedAvg, plus a proximal term to the received weights in the local loss"
    Params = FedProxParams
    client = FedProxClient
    server = FedAvgServer
    batchable = True  # CE plus a penalty of the parameters alone

    @classmethod
    def equivalent(cls, params: FedProxParams, scheme: str, local_epochs: int) -> tuple[str, dict] | None:
        """One local step starts at the received weights, where the proximal gradient mu(θ - θ_global) is zero."""
        if local_epochs != 1:
            return None
        values = dataclasses.asdict(params)
        values.pop("mu")
        return "fedavg", values
