"""H2GCN (K = 2), FedGMC's backbone, and its ego-activation variants."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch_geometric.data import Data

from gfl_bench.backbones.base import Backbone, input_layer, register_backbone
from gfl_bench.dropout import dropout
from gfl_bench.graph_ops import (
    h2gcn_adjacencies,
)


@dataclass(frozen=True)
class H2GCNRepresentations:
    """H2GCN's intermediate representations, which FedGMC calibrates."""

    ego: Tensor  # r0 = σ(X W_ego), structure-free (σ = ReLU unless a variant says otherwise)
    hop1: Tensor  # normalised 1-hop aggregation of ego embeddings
    hop2: Tensor  # normalised strict 2-hop aggregation of ego embeddings
    combined: Tensor  # [r0 || r1 || r2], the classifier's input


class H2GCN(Backbone):
    """H2GCN with K=2 rounds (Zhu et al., NeurIPS 2020; official `M64-R-T1-G-V-T2-G-V-C1-C2-D0.5-MO`).

    Ego and neighbour embeddings are kept apart: r1 = [A1 r0 || A2 r0], r2 = [A1 r1 || A2 r1] with
    the 1-hop and strict 2-hop operators A1, A2, and the classifier reads [r0 || r1 || r2]. Dense
    layers have no bias, as in the official code. The ego activation is ReLU (the official `R`);
    the registered variants `h2gcn-tanh` and `h2gcn-elu` swap it, because FedGMC's paper only says
    "a non-linear activation" and ReLU's non-negative embeddings cannot reach its anchors
    (docs/fedgmc.md, "Ego activation").
    """

    activation: ClassVar[str] = "relu"

    def __init__(self, in_dim: int, hidden: int, num_classes: int, dropout: float) -> None:
        super().__init__(in_dim, hidden, num_classes, dropout)
        self.ego = nn.Linear(in_dim, hidden, bias=False)
        self.classifier = nn.Linear(7 * hidden, num_classes, bias=False)

    @staticmethod
    def prepare(graph: Data, params: Any = None) -> None:
        if "hop1_adj" not in graph:
            graph.hop1_adj, graph.hop2_adj = h2gcn_adjacencies(graph.edge_index, graph.num_nodes)

    def representations(self, graph: Data) -> H2GCNRepresentations:
        ego = EGO_ACTIVATIONS[self.activation](input_layer(graph, self.ego))
        hop1 = graph.hop1_adj @ ego
        hop2 = graph.hop2_adj @ ego  # sparse or dense (graph_ops.dense_if_no_larger)
        r1 = torch.cat([hop1, hop2], dim=1)
        r2 = torch.cat([graph.hop1_adj @ r1, graph.hop2_adj @ r1], dim=1)
        return H2GCNRepresentations(ego, hop1, hop2, torch.cat([ego, r1, r2], dim=1))

    def embed(self, graph: Data) -> Tensor:
        return self.representations(graph).combined

    def forward(self, graph: Data) -> Tensor:
        h = dropout(self.embed(graph), self.dropout, self.training)
        return self.classifier(h)


EGO_ACTIVATIONS = {"relu": F.relu, "tanh": torch.tanh, "elu": F.elu}


def _h2gcn_with(activation: str) -> type[H2GCN]:
    return type(
        f"H2GCN_{activation}", (H2GCN,), {"activation": activation, "__doc__": f"H2GCN, ego activation {activation}."}
    )


register_backbone("h2gcn", H2GCN)
register_backbone("h2gcn-tanh", _h2gcn_with("tanh"))
register_backbone("h2gcn-elu", _h2gcn_with("elu"))

# FedGMC's backbone, which paper B.6 gives Local and FedAvg as well ("the identical GNN backbone"):
# H2GCN with a tanh ego activation, chosen on FedGMC's validation (docs/fedgmc.md, item 18).
FEDGMC_BACKBONE = "h2gcn-tanh"
