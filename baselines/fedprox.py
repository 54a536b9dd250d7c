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
        proximal = sum(
            (param - self.anchor[name]).pow(2).sum() for name, param in parameters.items() if name in self.anchor
        )
        return 0.5 * self.params.mu * proximal

    @classmethod
    def penalty_together(cls, clients: Sequence[FedProxClient], parameters: Mapping[str, Tensor]) -> Tensor:
        """Σ_m (mu/2) ||θ_m - θ_global,m||² on the stacked parameters, each client's gradient
        mu (θ_m - θ_global,m) as from its own `penalty`. The anchors are stacked once per round in the
        parameters' memory layout (`_anchor_stack`), so every epoch's term is one element-wise pass per
        parameter; `_SquaredDistance` keeps no difference for the backward (it recomputes it there)."""
        proximal = sum(
            _SquaredDistance.apply(stacked, _anchor_stack(clients, name, stacked))
            for name, stacked in parameters.items()
            if name in clients[0].anchor
        )
        return 0.5 * clients[0].params.mu * proximal


def _anchor_stack(clients: Sequence[FedProxClient], name: str, like: Tensor) -> Tensor:
    """Every client's θ_global for `name` in one tensor with the strides of the stacked parameter `like`.

    Built at the round's first step and kept on the first client; each client's anchor then becomes its
    view of the stack (same values), so the stack replaces the received copies instead of adding to
    them, and a new round's anchors (new tensors from `receive`) are noticed by identity."""
    cache: dict[str, tuple[tuple[Tensor, ...], Tensor]] = clients[0].__dict__.setdefault("_anchor_stacks", {})
    views, stack = cache.get(name, ((), None))
    if len(views) == len(clients) and all(client.anchor[name] is view for client, view in zip(clients, views)):
        return stack
    stack = torch.empty_like(like, requires_grad=False)  # the stack's own strides (input-major stacks stay so)
    for m, client in enumerate(clients):
        stack[m].copy_(client.anchor[name])
        client.anchor = {**client.anchor, name: stack[m]}
    cache[name] = (tuple(client.anchor[name] for client in clients), stack)
    return stack


class _SquaredDistance(torch.autograd.Function):
    """||stacked - anchors||² with the gradient 2 (stacked - anchors), recomputed in the backward instead of
    saved: autograd's own `(stacked - anchors).pow(2)` would keep the differences, which put batched
    FedProx's peak memory above OpenFGL's. Both tensors share one memory layout (`_anchor_stack`)."""

    @staticmethod
    def forward(ctx, stacked: Tensor, anchors: Tensor) -> Tensor:
        ctx.save_for_backward(stacked, anchors)
        return (stacked - anchors).pow_(2).sum()

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        stacked, anchors = ctx.saved_tensors
        return (stacked - anchors).mul_(2 * grad), None


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
