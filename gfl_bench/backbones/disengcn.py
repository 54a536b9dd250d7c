"""DisenGCN as FedIIH trains it, and its neighbourhood routing."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch_geometric.data import Data

from gflbench.backbones.base import Backbone, input_layer, register_backbone
from gflbench.backbones.dropout import dropout
from gflbench.backbones.graph_ops import (
    EdgeOperators,
    edge_dots,
    edge_weighted_sum,
)
from gflbench.errors import UserError

ROUTING_KERNELS = ("gather", "sparse")


def neighbourhood_routing(
    z: Tensor, edge_index: Tensor, iterations: int, tau: float = 1.0, kernel: str = "gather",
    operators: EdgeOperators | None = None,
) -> Tensor:  # fmt: skip
    """One parameter-free DisenConv layer (Ma et al., ICML 2019, Alg. 1; FedIIH appendix A, Eqs. 1-2).

    ẑ_{i,k} = z_{i,k} / ‖z_{i,k}‖; c_{u,k} starts at ẑ_{u,k}; then `iterations` times, for every edge v → u:
        p_{v,k} = softmax_k(ẑ_{v,k}ᵀ c_{u,k} / τ),   c_{u,k} = normalise(ẑ_{u,k} + Σ_{v→u} p_{v,k} ẑ_{v,k}).
    No N × N matrix either way; an isolated node returns ẑ_u. Two kernels for the same arithmetic:
    - "gather": vectorised over edges (both ends of every edge gathered [E, K, h], index_add);
    - "sparse": factor-major, the edge terms as sampled and CSR products per factor
      (`graph_ops.edge_dots`, `edge_weighted_sum`), memory E·K + N·K·h; several times faster on a
      CPU (docs/baselines/fediih.md, "Cost"). Its float rounding differs (outputs agree to about
      1e-7), which FedIIH's first round amplifies, so a run's numbers depend on the kernel.
      `operators` is its CSR structure of `edge_index` (`graph_ops.EdgeOperators`), for a caller that
      keeps it across calls (`DisenGCN` does, per graph); built here otherwise.
    Shapes: z [N, K, h], edge_index [2, E] (row 0 = source v, row 1 = target u) → c [N, K, h].
    """
    if kernel == "sparse":
        return _sparse_routing(z, edge_index, iterations, tau, operators)
    unit = F.normalize(z, dim=2)  # ẑ [N, K, h]
    source, target = edge_index
    neighbour = unit.index_select(0, source)  # ẑ_v per edge [E, K, h]
    centre = unit
    for _ in range(iterations):
        affinity = (neighbour * centre.index_select(0, target)).sum(dim=2) / tau  # [E, K]
        p = torch.softmax(affinity, dim=1)  # over factors, per edge
        centre = F.normalize(unit.index_add(0, target, neighbour * p.unsqueeze(2)), dim=2)  # [N, K, h]
    return centre


def _sparse_routing(
    z: Tensor, edge_index: Tensor, iterations: int, tau: float, operators: EdgeOperators | None
) -> Tensor:
    """`neighbourhood_routing`'s "sparse" kernel: the same steps on factor-major [K, N, h] tensors."""
    unit = F.normalize(z, dim=2).transpose(0, 1).contiguous()  # ẑ [K, N, h]
    if iterations == 0 or edge_index.shape[1] == 0:
        return unit.transpose(0, 1)
    ops = operators if operators is not None else EdgeOperators(edge_index, z.shape[0])
    centre = unit
    for _ in range(iterations):
        p = torch.softmax(edge_dots(centre, unit, ops) / tau, dim=1)  # [E, K], over factors per edge
        centre = F.normalize(unit + edge_weighted_sum(p, unit, ops), dim=2)  # [K, N, h]
    return centre.transpose(0, 1)


class DisenGCN(Backbone):
    """DisenGCN as FedIIH trains it (Ma et al., ICML 2019; FedIIH `FedIIH_K/models/nets.py::DisentangledGNN`).

    Projection into K factor channels, then L_b parameter-free routing layers, then the head:
        z_{i,k} = LeakyReLU(W_k x_i + b_k)                                 (dropout after)
        c = routing(z) (`neighbourhood_routing`: ẑ unit-normalised per factor, T iterations,
            p_{v,k} = softmax_k(ẑ_{v,k}ᵀ c_{u,k}/τ), c_{u,k} = normalise(ẑ_{u,k} + Σ_v p_{v,k} ẑ_{v,k})),
            each layer followed by LeakyReLU and dropout
        logits = W_cls [c_{·,1} ∥ … ∥ c_{·,K}] + b_cls.
    K = `factors`, T = `routing_iters`, τ = `routing_tau` (1 in FedIIH), h = `hidden` (per factor; the
    official `n_latentdims`); `routing_kernel` picks `neighbourhood_routing`'s kernel. `variational` adds FedIIH's two encoder heads (μ and log σ², Appendix E):
    each is a further stack of routing layers on the shared base output, so the heads add no parameters.
    `routing_layers` = L is FedIIH's `n_layers` ("# neighborhood routing layers", Tables 3-4), split as
    the official code does: L ≤ 2 gives 1 base layer and 1 per head, L > 2 gives L − 2 base layers and
    2 per head. Projection weights are uniform in ±1/sqrt(K·h) (official `SparseInputLinear`).

    Shapes: x [N, F] → z [N, K, h] → c [N, K, h] → embed [N, K·h] → logits [N, C].
    """

    options = ("factors", "routing_layers", "routing_iters", "routing_tau", "routing_kernel")
    # The axis of each parameter that holds K consecutive factor blocks of width h (FedIIH aggregates
    # them factor by factor); parameters not listed (the classifier bias) have no factor structure.
    factor_axes: ClassVar[dict[str, int]] = {"projection.weight": 0, "projection.bias": 0, "classifier.weight": 1}
    defaults: ClassVar[dict[str, Any]] = {
        "factors": 2, "routing_layers": 5, "routing_iters": 6, "routing_tau": 1.0, "routing_kernel": "gather",
    }  # fmt: skip
    checkpoint_above: ClassVar[int] = (
        2**24
    )  # E·K·h above which routing layers are recomputed for backward (64 MB per gather)

    def __init__(
        self, in_dim: int, hidden: int, num_classes: int, dropout: float, factors: int = 2, base_layers: int = 1,
        head_layers: int = 1, iterations: int = 6, tau: float = 1.0, kernel: str = "gather",
    ) -> None:  # fmt: skip
        super().__init__(in_dim, hidden, num_classes, dropout)
        if factors < 1 or base_layers < 0 or head_layers < 0 or iterations < 0 or tau <= 0:
            raise UserError(
                f"DisenGCN needs factors >= 1, layers and iterations >= 0 and tau > 0; got K={factors}, "
                f"layers {base_layers}/{head_layers}, T={iterations}, tau={tau}"
            )
        if kernel not in ROUTING_KERNELS:
            raise UserError(f"routing_kernel must be one of {', '.join(ROUTING_KERNELS)}; got {kernel!r}")
        self.kernel = kernel
        self._operators: tuple[Tensor, EdgeOperators] | None = None  # the sparse kernel's, for one edge_index
        self.factors, self.factor_dim = factors, hidden
        self.base_layers, self.head_layers = base_layers, head_layers
        self.iterations, self.tau = iterations, tau
        self.projection = nn.Linear(in_dim, factors * hidden)  # W = [W_1; …; W_K], [K·h, F]
        bound = 1.0 / math.sqrt(factors * hidden)
        nn.init.uniform_(self.projection.weight, -bound, bound)
        nn.init.uniform_(self.projection.bias, -bound, bound)
        self.classifier = nn.Linear(factors * hidden, num_classes)

    @classmethod
    def from_params(cls, in_dim: int, num_classes: int, params: Any) -> Backbone:
        value = {name: getattr(params, name, default) for name, default in cls.defaults.items()}
        layers = value["routing_layers"]
        base, head = (1, 1) if layers <= 2 else (layers - 2, 2)
        return cls(
            in_dim, params.hidden, num_classes, params.dropout, value["factors"], base, head,
            value["routing_iters"], value["routing_tau"], value["routing_kernel"],
        )  # fmt: skip

    def _activate(self, h: Tensor) -> Tensor:
        return dropout(F.leaky_relu(h), self.dropout, self.training)

    def _route(self, z: Tensor, graph: Data, layers: int) -> Tensor:
        from torch.utils.checkpoint import checkpoint

        # The gather kernel's autograd would keep T gathered [E, K, h] tensors per layer; on large clients
        # (arxiv-sized: GBs) each layer is recomputed in the backward pass instead (same numbers, one
        # extra forward). The sparse kernel keeps none.
        gathers = self.kernel == "gather" and graph.edge_index.shape[1] * z[0].numel() > self.checkpoint_above
        recompute = z.requires_grad and gathers
        operators = self._edge_operators(graph.edge_index, z.shape[0]) if self.kernel == "sparse" else None
        for _ in range(layers):
            args = (z, graph.edge_index, self.iterations, self.tau, self.kernel, operators)
            z = (
                checkpoint(neighbourhood_routing, *args, use_reentrant=False)
                if recompute
                else neighbourhood_routing(*args)
            )
            z = self._activate(z)
        return z

    def _edge_operators(self, edge_index: Tensor, num_nodes: int) -> EdgeOperators:
        """The sparse kernel's CSR structure of the client's graph, built at its first forward and kept
        (the graph is fixed; every routing layer of every step would otherwise sort its edges again)."""
        cached = self._operators
        if cached is None or cached[0] is not edge_index or cached[1].num_nodes != num_nodes:
            self._operators = cached = (edge_index, EdgeOperators(edge_index, num_nodes))
        return cached[1]

    def factor_embeddings(self, graph: Data) -> Tensor:
        """The base output c after the L_b routing layers, per factor. [N, K, h]"""
        z = self._activate(input_layer(graph, self.projection.weight, self.projection.bias)).view(
            -1, self.factors, self.factor_dim
        )  # [N, K, h]
        return self._route(z, graph, self.base_layers)

    def embed(self, graph: Data) -> Tensor:
        return self.factor_embeddings(graph).flatten(1)  # [N, K·h]

    def forward(self, graph: Data) -> Tensor:
        return self.classifier(self.embed(graph))

    def variational(self, graph: Data) -> tuple[Tensor, Tensor]:
        """FedIIH's encoder: (μ, log σ²) per node and factor, each [N, K, h], from the shared base output."""
        base = self.factor_embeddings(graph)
        return self._route(base, graph, self.head_layers), self._route(base, graph, self.head_layers)


register_backbone("disengcn", DisenGCN)
