r"""The 2-layer GCN + classifier of the FED-PUB protocol (Kipf & Welling, ICLR 2017; FED-PUB `nets.GCN`).

.. math::
    H_1 = \mathrm{ReLU}(\hat{A} X W_1^\top + b_1), \qquad
    H_2 = \hat{A}\, \mathrm{dropout}(H_1) W_2^\top + b_2, \qquad
    \mathrm{logits} = \mathrm{dropout}(\mathrm{ReLU}(H_2)) W_C^\top + b_C

with :math:`\hat{A} = \tilde{D}^{-1/2}(A + I)\tilde{D}^{-1/2}` (`graph_ops.gcn_adjacency`, attached as
`gcn_adj`). Shapes: X [N, F] → H_1 [N, h] → H_2 [N, h] (`embed`) → logits [N, C]; with a leading
client axis M on every tensor (parameters `[M, ...]`) on the batched path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn
from torch.nn import functional as F
from torch_geometric.data import Data
from torch_geometric.nn import GCNConv

from gflbench.backbones.base import GraphPass, StackedBackbone, per_node, register_backbone
from gflbench.backbones.graph_ops import gcn_adjacency


class GCN(StackedBackbone):
    """Two GCN layers and a linear classifier (FED-PUB `nets.GCN`, protocol §1.5); equation above.

    The layers are PyG modules (`conv1`, `conv2`: `GCNConv` without its own normalisation), for their
    parameter names and initialisation; the forward is `network`, for one client or many. `embed`
    returns H_2, the second layer's output before its ReLU, the tap FED-PUB uses for its functional
    embeddings. A variant that changes how a weight is used (FED-PUB's masked GCN) overrides `weight`.
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

    def weight(self, p: Mapping[str, Tensor], layer: str, training: bool) -> Tensor:
        """The weight matrix of `layer` ("conv1", "conv2" or "classifier") as the network multiplies by it."""
        return p[f"{layer}.weight" if layer == "classifier" else f"{layer}.lin.weight"]

    def encode(self, p: Mapping[str, Tensor], g: GraphPass) -> Tensor:
        """H_2, [..., N, h]."""
        h = F.relu(g.propagate("gcn_adj", g.features(self.weight(p, "conv1", g.training))) + per_node(p["conv1.bias"]))
        h = g.dropout(h)
        return g.propagate("gcn_adj", g.linear(h, self.weight(p, "conv2", g.training))) + per_node(p["conv2.bias"])

    def network(self, p: Mapping[str, Tensor], g: GraphPass) -> tuple[Tensor, Any]:
        h = g.dropout(F.relu(self.encode(p, g)))
        return g.linear(h, self.weight(p, "classifier", g.training), p["classifier.bias"]), None

    def embed(self, graph: Data) -> Tensor:
        return self.encode(self.weights(), self.client_pass(graph))


register_backbone("gcn", GCN)
