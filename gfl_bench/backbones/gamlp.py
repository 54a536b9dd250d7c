"""GAMLP as FedGTA trains it."""

from __future__ import annotations

import itertools
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch_geometric.data import Data

from gflbench.backbones.base import Backbone, register_backbone
from gflbench.backbones.dropout import dropout
from gflbench.backbones.graph_ops import (
    gcn_adjacency,
)
from gflbench.errors import UserError


class GAMLP(Backbone):
    """GAMLP in the simplified form FedGTA trains (SimGAMLP; Zhang et al., KDD 2022; official FedGTA
    `gnn_model/scalable/{sim_gamlp,simple_models}.py`, `operators/message_operator/.../sim_learnable_weighted_messahe_op.py`).

    Propagation, once per client (`prepare`): X⁽ᵏ⁾ = Âᵏ X for k = 0..K, Â = D̃^-1/2 (A + I) D̃^-1/2
    (the official r = 0.5), K = `gamlp_steps`. Node-wise hop attention (the official "jk" combination):
        s_k(v) = σ(aᵀ [X⁽⁰⁾_v ∥ … ∥ X⁽ᴷ⁾_v ∥ X⁽ᵏ⁾_v] + b),  α(v) = softmax_k s_k(v),  X̄_v = Σ_k α_k(v) X⁽ᵏ⁾_v,
    then an MLP of L = `gamlp_layers` layers: (L − 1) × [Linear → PReLU (one shared slope) → dropout],
    and the head `classifier` (Linear to C). Weights Xavier-uniform with ReLU gain, zero biases, as in
    the official MLP. The official code reshapes the hop scores hop-major into a node-major view, so a
    node's weights come from other nodes' scores; here each node attends over its own hops (the
    equation above; docs/baselines/fedgta.md).

    Shapes: hops [N, K+1, F] (node-major: each node's hops lie together) → X̄ [N, F] → embed [N, hidden]
    → logits [N, C].
    """

    options = ("gamlp_steps", "gamlp_layers")
    default_steps: ClassVar[int] = 3  # official prop_steps
    default_layers: ClassVar[int] = 3  # official num_layers

    def __init__(
        self, in_dim: int, hidden: int, num_classes: int, dropout: float, steps: int = 3, layers: int = 3
    ) -> None:
        super().__init__(in_dim, hidden, num_classes, dropout)
        if steps < 0 or layers < 2:
            raise UserError(f"GAMLP needs gamlp_steps >= 0 and gamlp_layers >= 2, got {steps} and {layers}")
        self.steps = steps
        self.hop_attention = nn.Linear((steps + 2) * in_dim, 1)  # a, b over [X⁽⁰⁾ ∥ … ∥ X⁽ᴷ⁾ ∥ X⁽ᵏ⁾]
        widths = [in_dim] + [hidden] * (layers - 1)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(widths))
        self.act = nn.PReLU()
        self.classifier = nn.Linear(hidden, num_classes)
        for linear in (*self.layers, self.classifier):
            nn.init.xavier_uniform_(linear.weight, gain=nn.init.calculate_gain("relu"))
            nn.init.zeros_(linear.bias)

    @classmethod
    def from_params(cls, in_dim: int, num_classes: int, params: Any) -> Backbone:
        steps = getattr(params, "gamlp_steps", cls.default_steps)
        layers = getattr(params, "gamlp_layers", cls.default_layers)
        return cls(in_dim, params.hidden, num_classes, params.dropout, steps, layers)

    @staticmethod
    def prepare(graph: Data, params: Any = None) -> None:
        """Attach `gcn_adj` (Â) and `gamlp_hops`, X⁽ᵏ⁾ = ÂᵏX stacked node-major as [N, K+1, F]."""
        steps = getattr(params, "gamlp_steps", GAMLP.default_steps)
        if "gcn_adj" not in graph:
            graph.gcn_adj = gcn_adjacency(graph.edge_index, graph.num_nodes)
        hops = [graph.x.float()]
        for _ in range(steps):
            hops.append(torch.sparse.mm(graph.gcn_adj, hops[-1]))
        graph.gamlp_hops = torch.stack(hops, dim=1)  # [N, K+1, F]

    def hop_weights(self, hops: Tensor) -> Tensor:
        """α [N, K+1]: each node's softmax over σ(aᵀ[all hops ∥ hop k] + b)."""
        num_nodes, num_hops, dim = hops.shape
        if num_hops != self.steps + 1:
            raise ValueError(f"GAMLP built for {self.steps} steps got {num_hops - 1} propagated hops")
        a = self.hop_attention.weight.view(-1)
        a_all, a_own = a[: num_hops * dim], a[num_hops * dim :]
        shared = hops.reshape(num_nodes, -1) @ a_all  # aᵀ[X⁽⁰⁾_v ∥ … ∥ X⁽ᴷ⁾_v], [N]
        scores = torch.sigmoid(shared.unsqueeze(1) + hops @ a_own + self.hop_attention.bias)  # [N, K+1]
        return torch.softmax(scores, dim=1)

    def embed(self, graph: Data) -> Tensor:
        hops = graph.gamlp_hops
        h = torch.bmm(self.hop_weights(hops).unsqueeze(1), hops).squeeze(1)  # X̄ = Σ_k α_k X⁽ᵏ⁾, [N, F]
        for layer in self.layers:
            h = dropout(self.act(layer(h)), self.dropout, self.training)
        return h

    def forward(self, graph: Data) -> Tensor:
        return self.classifier(self.embed(graph))


register_backbone("gamlp", GAMLP)
