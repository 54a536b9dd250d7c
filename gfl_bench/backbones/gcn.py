"""The 2-layer GCN + classifier of the FED-PUB protocol."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn
from torch.nn import functional as F
from torch_geometric.data import Data
from torch_geometric.nn import GCNConv

from gfl_bench.backbones.base import Backbone, input_layer, register_backbone
from gfl_bench.dropout import dropout
from gfl_bench.graph_ops import (
    gcn_adjacency,
)


class GCN(Backbone):
    """Two GCN layers and a linear classifier (FED-PUB `nets.GCN`, protocol §1.5).

    `embed` returns the second layer's output before its ReLU, the tap FED-PUB uses for its
    functional embeddings.
    """

    def __init__(self, in_dim: int, hidden: int, num_classes: int, dropout: float) -> None:
        super().__init__(in_dim, hidden, num_classes, dropout)
        self.conv1 = GCNConv(in_dim, hidden, normalize=False)
        self.conv2 = GCNConv(hidden, hidden, normalize=False)
        self.classifier = nn.Linear(hidden, num_classes)

    @staticmethod
    def prepare(graph: Data, params: Any = None) -> None:
        if "gcn_adj" not in graph:
            graph.gcn_adj = gcn_adjacency(graph.edge_index, graph.num_nodes)

    def embed(self, graph: Data) -> Tensor:
        h = F.relu(
            self.conv1.propagate(graph.gcn_adj, x=input_layer(graph, self.conv1.lin), edge_weight=None)
            + self.conv1.bias
        )
        h = dropout(h, self.dropout, self.training)
        return self.conv2(h, graph.gcn_adj)

    def forward(self, graph: Data) -> Tensor:
        h = dropout(F.relu(self.embed(graph)), self.dropout, self.training)
        return self.classifier(h)


register_backbone("gcn", GCN)
