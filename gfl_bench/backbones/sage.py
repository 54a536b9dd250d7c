r"""GraphSAGE with the mean aggregator (Hamilton et al., NeurIPS 2017; PyG `SAGEConv`), FedSage+'s encoder.

.. math::
    H_1 = \mathrm{ReLU}\big(\mathrm{mean}_{\mathcal{N}}(X) W_{l,1}^\top + b_{l,1} + X W_{r,1}^\top\big),\qquad
    H_2 = \mathrm{mean}_{\mathcal{N}}(\mathrm{dropout}(H_1)) W_{l,2}^\top + b_{l,2}
          + \mathrm{dropout}(H_1) W_{r,2}^\top,

    \mathrm{logits} = \mathrm{dropout}(\mathrm{ReLU}(H_2)) W_C^\top + b_C

where :math:`\mathrm{mean}_{\mathcal{N}}` averages over each node's neighbours in the binary adjacency
`adj` (`graph_ops.binary_adjacency`). Shapes: X [N, F] → H_1 [N, h] → H_2 [N, h] (`embed`) → logits
[N, C]; with a leading client axis M on the batched path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn
from torch.nn import functional as F
from torch_geometric.data import Data
from torch_geometric.nn import SAGEConv

from gflbench.backbones.base import GraphPass, StackedBackbone, register_backbone
from gflbench.backbones.graph_ops import binary_adjacency


class GraphSAGE(StackedBackbone):
    """Two GraphSAGE layers (mean aggregator) and a linear classifier; equation above.

    The encoder FedSage+ uses (paper B.6), laid out like `GCN` so that its head is a separate Linear;
    the layers are PyG `SAGEConv` modules for their parameters, the forward is `network`. Full-batch,
    all neighbours (no sampling), as every method here.
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

    @staticmethod
    def layer(p: Mapping[str, Tensor], g: GraphPass, name: str, h: Tensor | None) -> Tensor:
        """mean_N(h) W_l + b_l + h W_r for the SAGE layer `name`; h None for the node features."""
        neighbours = g.mean_linear("adj", h, p[f"{name}.lin_l.weight"], p[f"{name}.lin_l.bias"])
        root = p[f"{name}.lin_r.weight"]
        return neighbours + (g.features(root) if h is None else g.linear(h, root))

    def encode(self, p: Mapping[str, Tensor], g: GraphPass) -> Tensor:
        """H_2, [..., N, h]."""
        return self.layer(p, g, "conv2", g.dropout(F.relu(self.layer(p, g, "conv1", None))))

    def network(self, p: Mapping[str, Tensor], g: GraphPass) -> tuple[Tensor, Any]:
        h = g.dropout(F.relu(self.encode(p, g)))
        return g.linear(h, p["classifier.weight"], p["classifier.bias"]), None

    def embed(self, graph: Data) -> Tensor:
        return self.encode(self.weights(), self.client_pass(graph))


register_backbone("sage", GraphSAGE)
