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
        """Σ_m (mu/2) ||θ_m - θ_global,m||² on the stacked parameters, each client's gradient
        mu (θ_m - θ_global,m) as from its own `penalty`. `_SquaredDistance` keeps no difference for the
        backward (it recomputes it there), so the term costs no memory of the model's size per client."""
        proximal = sum(
            _SquaredDistance.apply(stacked, [client.anchor[name] for client in clients])
            for name, stacked in parameters.items()
            if name in clients[0].anchor
        )
        return 0.5 * clients[0].params.mu * proximal


class _SquaredDistance(torch.autograd.Function):
    """Σ_m ||stacked[m] - anchors[m]||² with the gradient 2 (stacked[m] - anchors[m]), recomputed in the
    backward instead of saved: autograd's own `(stacked - anchors).pow(2)` would keep the differences,
    which put batched FedProx's peak memory above OpenFGL's."""

    @staticmethod
    def forward(ctx, stacked: Tensor, anchors: list[Tensor]) -> Tensor:  # noqa: ANN001 - autograd's signature
        ctx.anchors = anchors
        ctx.save_for_backward(stacked)
        return sum((own - anchor).pow(2).sum() for own, anchor in zip(stacked, anchors))

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # noqa: ANN001
        (stacked,) = ctx.saved_tensors
        difference = torch.empty_like(stacked)  # the stack's own strides
        for m, anchor in enumerate(ctx.anchors):
            torch.sub(stacked[m], anchor, out=difference[m])
        return difference.mul_(2 * grad), None


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
