"""GraphSAGE (mean aggregator), FedSage+'s encoder."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn
from torch.nn import functional as F
from torch_geometric.data import Data
from torch_geometric.nn import SAGEConv

from gfl_bench.backbones.base import Backbone, register_backbone
from gfl_bench.dropout import dropout
from gfl_bench.graph_ops import (
    binary_adjacency,
)


class GraphSAGE(Backbone):
    """Two GraphSAGE layers (mean aggregator, PyG SAGEConv) and a linear classifier.

    The encoder FedSage+ uses (paper B.6; Hamilton et al., 2017), laid out like `GCN` so that its
    head is a separate Linear. Full-batch, all neighbours (no sampling), as every method here.
    """

    def __init__(self, in_dim: int, hidden: int, num_classes: int, dropout: float) -> None:
        super().__init__(in_dim, hidden, num_classes, dropout)
        self.conv1 = SAGEConv(in_dim, hidden)
        self.conv2 = SAGEConv(hidden, hidden)
        self.classifier = nn.Linear(hidden, num_classes)

    @staticmethod
    def prepare(graph: Data, params: Any = None) -> None:
        if "adj" not in graph:
            graph.adj = binary_adjacency(graph.edge_index, graph.num_nodes)

    def embed(self, graph: Data) -> Tensor:
        h = dropout(F.relu(self.conv1(graph.x, graph.adj)), self.dropout, self.training)
        return self.conv2(h, graph.adj)

    def forward(self, graph: Data) -> Tensor:
        h = dropout(F.relu(self.embed(graph)), self.dropout, self.training)
        return self.classifier(h)


register_backbone("sage", GraphSAGE)
