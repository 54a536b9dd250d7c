"""The GNN backbones the methods train: the 2-layer GCN + classifier of the FED-PUB protocol and H2GCN.

Each backbone names its classification head (`head`), which personalised methods keep local, and
declares the graph operators it needs (`prepare`), computed once per client before training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch_geometric.data import Data
from torch_geometric.nn import GCNConv, SAGEConv

from gfl_bench.errors import UserError
from gfl_bench.graph_ops import binary_adjacency, gcn_adjacency, h2gcn_adjacencies


def input_layer(graph: Data, linear: nn.Module) -> Tensor:
    """`linear(graph.x)`, from the sparse copy `graph.x_sparse` when the run attached one.

    Bag-of-words features are over 98 % zeros, and this product is the only one whose cost grows with
    the feature count: a CSR copy makes it 2-5× cheaper on Cora (bench/sparse_features.py). The result
    equals the dense product up to float summation order; the run record says which path ran.
    """
    if "x_sparse" not in graph:
        return linear(graph.x)
    out = torch.sparse.mm(graph.x_sparse, linear.weight.T)
    return out if linear.bias is None else out + linear.bias


class Backbone(nn.Module):
    """A node classifier on one client's graph: `forward(graph)` returns logits for every node.

    A backbone with options beyond width and dropout (DisenGCN's factors, UniFilter's levels) reads
    them from the method's Params: it names those fields in `options` and overrides `from_params`.
    `prepare` may read them too; the runner caches prepared graphs per (backbone, device, options),
    so a sweep over an option never reuses operators computed for another value.
    """

    head: ClassVar[str] = "classifier"  # prefix of the parameters that form the classification head
    options: ClassVar[tuple[str, ...]] = ()  # Params fields that construction and `prepare` read

    def __init__(self, in_dim: int, hidden: int, num_classes: int, dropout: float) -> None:
        super().__init__()
        self.dropout = dropout

    @classmethod
    def from_params(cls, in_dim: int, num_classes: int, params: Any) -> Backbone:
        """The backbone a method's Params describe (width, dropout and the fields in `options`)."""
        return cls(in_dim, params.hidden, num_classes, params.dropout)

    @staticmethod
    def prepare(graph: Data, params: Any = None) -> None:
        """Attach the operators `forward` reads to `graph` (called once per client, before training).

        `params` is the method's Params; only the fields named in `options` may be read.
        """


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
        h = F.relu(self.conv1.propagate(graph.gcn_adj, x=input_layer(graph, self.conv1.lin), edge_weight=None) + self.conv1.bias)
        h = F.dropout(h, self.dropout, self.training)
        return self.conv2(h, graph.gcn_adj)

    def forward(self, graph: Data) -> Tensor:
        h = F.dropout(F.relu(self.embed(graph)), self.dropout, self.training)
        return self.classifier(h)


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
        h = F.dropout(F.relu(self.conv1(graph.x, graph.adj)), self.dropout, self.training)
        return self.conv2(h, graph.adj)

    def forward(self, graph: Data) -> Tensor:
        h = F.dropout(F.relu(self.embed(graph)), self.dropout, self.training)
        return self.classifier(h)


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
        hop1 = torch.sparse.mm(graph.hop1_adj, ego)
        hop2 = torch.sparse.mm(graph.hop2_adj, ego)
        r1 = torch.cat([hop1, hop2], dim=1)
        r2 = torch.cat([torch.sparse.mm(graph.hop1_adj, r1), torch.sparse.mm(graph.hop2_adj, r1)], dim=1)
        return H2GCNRepresentations(ego, hop1, hop2, torch.cat([ego, r1, r2], dim=1))

    def embed(self, graph: Data) -> Tensor:
        return self.representations(graph).combined

    def forward(self, graph: Data) -> Tensor:
        h = F.dropout(self.embed(graph), self.dropout, self.training)
        return self.classifier(h)


EGO_ACTIVATIONS = {"relu": F.relu, "tanh": torch.tanh, "elu": F.elu}


def _h2gcn_with(activation: str) -> type[H2GCN]:
    return type(f"H2GCN_{activation}", (H2GCN,), {"activation": activation, "__doc__": f"H2GCN, ego activation {activation}."})


BACKBONES: dict[str, type[Backbone]] = {
    "gcn": GCN, "sage": GraphSAGE, "h2gcn": H2GCN, "h2gcn-tanh": _h2gcn_with("tanh"), "h2gcn-elu": _h2gcn_with("elu"),
}  # fmt: skip

# FedGMC's backbone, which paper B.6 gives Local and FedAvg as well ("the identical GNN backbone"):
# H2GCN with a tanh ego activation, chosen on FedGMC's validation (docs/fedgmc.md, item 18).
FEDGMC_BACKBONE = "h2gcn-tanh"


def register_backbone(name: str, backbone: type[Backbone]) -> type[Backbone]:
    """Make a method-specific backbone (e.g. FED-PUB's masked GCN) selectable by name."""
    if BACKBONES.get(name, backbone) is not backbone:
        raise ValueError(f"backbone name {name!r} registered twice")
    BACKBONES[name] = backbone
    return backbone


def build_backbone(params: Any, in_dim: int, num_classes: int) -> Backbone:
    """The backbone `params.backbone` names, built from the method's Params."""
    return backbone_class(params.backbone).from_params(in_dim, num_classes, params)


def prepared_key(params: Any) -> tuple:
    """What a prepared graph depends on: the backbone and the values of its `options`."""
    return (params.backbone, *((name, getattr(params, name)) for name in backbone_class(params.backbone).options))


def backbone_class(name: str) -> type[Backbone]:
    try:
        return BACKBONES[name]
    except KeyError:
        raise UserError(f"unknown backbone {name!r}; choose from {', '.join(BACKBONES)}") from None
