"""What every backbone is (`Backbone`), the forward written once for one client or many
(`StackedBackbone`, `GraphPass`, `ClientPass`), the first layer they share (`input_layer`), and the
registry of backbones by name (`BACKBONES`, `register_backbone`, `build_backbone`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch_geometric.data import Data
from torch_geometric.utils import spmm

from gflbench.backbones.dropout import dropout
from gflbench.errors import UserError


def input_layer(graph: Data, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """X Wᵀ (+ b) of one client's features, from the sparse copy `graph.x_sparse` when the run attached one.

    Bag-of-words features are over 98 % zeros, and this product is the only one whose cost grows with
    the feature count: a CSR copy makes it 2-5× cheaper on Cora (bench/sparse_features.py). The result
    equals the dense product up to float summation order; the run record says which path ran.
    Shapes: X [N, F], W [h, F], b [h] → [N, h].
    """
    if "x_sparse" not in graph:
        return F.linear(graph.x, weight, bias)
    out = torch.sparse.mm(graph.x_sparse, weight.T)
    return out if bias is None else out + bias


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

    def outputs(self, graph: Data) -> tuple[Tensor, Any]:
        """Logits and the representations the backbone exposes to a method's objective (none here)."""
        return self(graph), None


class GraphPass(Protocol):
    """The graph side of one forward pass of a `StackedBackbone`: the products that involve the graph.

    Two implementations: `ClientPass`, one client's graph with parameters as `named_parameters()` holds
    them (the per-client path), and the batched executor's pass over every client's graph packed
    together, with parameters that carry a leading client axis `[M, ...]` (gfl_bench/core/batched.py). The
    network's code is the same for both; only these products and the dropout differ, so that each
    path keeps its own kernels (and the per-client path its numbers, bit for bit).
    Shapes below for one client; the packed pass adds the client axis M in front of every one.
    """

    training: bool  # whether the pass trains (dropout on; FED-PUB's masks unpruned)

    def features(self, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """X Wᵀ (+ b), the first layer on the node features: W [h, F], b [h] → [N, h]."""
        ...

    def linear(self, h: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """h Wᵀ (+ b): h [N, d], W [h', d], b [h'] → [N, h']."""
        ...

    def propagate(self, operator: str, h: Tensor) -> Tensor:
        """A h for the graph operator A that `prepare` attached as `operator`: [N, d] → [N, d]."""
        ...

    def mean_linear(self, operator: str, h: Tensor | None, weight: Tensor, bias: Tensor | None) -> Tensor:
        """mean over each node's neighbours in `operator` (a binary adjacency) of h, times Wᵀ, plus b;
        h None for the node features. [N, d] → [N, h'] (GraphSAGE's neighbour term)."""
        ...

    def dropout(self, h: Tensor) -> Tensor:
        """h with the backbone's dropout applied (the identity unless training)."""
        ...


class ClientPass:
    """`GraphPass` over one client's graph, parameters without a client axis: the per-client path.

    Each product is the one the PyG layers it replaces compute (`GCNConv`, `SAGEConv`, `nn.Linear`), so
    the numbers are theirs bit for bit: `A @ h` is `torch.sparse.mm` (GCNConv's propagation), the
    neighbour mean PyG's `spmm(reduce="mean")` followed by `F.linear` (SAGEConv's order).
    """

    def __init__(self, graph: Data, dropout: float, training: bool) -> None:
        self.graph, self.p, self.training = graph, dropout, training

    def features(self, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        return input_layer(self.graph, weight, bias)

    def linear(self, h: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        return F.linear(h, weight, bias)

    def propagate(self, operator: str, h: Tensor) -> Tensor:
        return self.graph[operator] @ h

    def mean_linear(self, operator: str, h: Tensor | None, weight: Tensor, bias: Tensor | None) -> Tensor:
        return F.linear(spmm(self.graph[operator], self.graph.x if h is None else h, reduce="mean"), weight, bias)

    def dropout(self, h: Tensor) -> Tensor:
        return dropout(h, self.p, self.training)


def per_node(bias: Tensor) -> Tensor:
    """A bias `[..., d]` broadcast over the nodes of `[..., N, d]` (one client or a client stack)."""
    return bias.unsqueeze(-2)


class StackedBackbone(Backbone, ABC):
    """A backbone whose network is written once, on parameters that may carry a leading client axis.

    `network(p, g)` is the whole forward: `p` maps parameter names to tensors (as `named_parameters()`
    holds them, or `[M, *shape]` stacks of M clients), `g` is the `GraphPass` that supplies the
    products with the graph. `forward` is its one-client case; the batched executor
    (gfl_bench/core/batched.py) calls the same `network` with stacked parameters and every client's
    graph packed together, so a stacked backbone is batchable by construction.
    """

    def weights(self) -> dict[str, Tensor]:
        """The parameters by name, as `network` reads them on the per-client path."""
        return dict(self.named_parameters())

    def client_pass(self, graph: Data) -> ClientPass:
        return ClientPass(graph, self.dropout, self.training)

    @abstractmethod
    def network(self, p: Mapping[str, Tensor], g: GraphPass) -> tuple[Tensor, Any]:
        """Logits `[..., N, C]` and the representations the backbone exposes (None if none)."""

    def outputs(self, graph: Data) -> tuple[Tensor, Any]:
        """Logits and representations of one client's graph (`network` on this model's parameters)."""
        return self.network(self.weights(), self.client_pass(graph))

    def forward(self, graph: Data) -> Tensor:
        return self.outputs(graph)[0]


# Every backbone by name; each backbone's module registers its own (a method may add one: FED-PUB's masked GCN).
BACKBONES: dict[str, type[Backbone]] = {}


def register_backbone(name: str, backbone: type[Backbone]) -> type[Backbone]:
    """Make a method-specific backbone (e.g. FED-PUB's masked GCN) selectable by name."""
    if BACKBONES.get(name, backbone) is not backbone:
        raise ValueError(f"backbone name {name!r} registered twice")
    BACKBONES[name] = backbone
    return backbone


def build_backbone(params: Any, in_dim: int, num_classes: int) -> Backbone:
    """The backbone `params.backbone` names, built from the method's Params."""
    return backbone_class(params.backbone).from_params(in_dim, num_classes, params)


def prepared_key(params: Any) -> tuple[Any, ...]:
    """What a prepared graph depends on: the backbone and the values of its `options`."""
    return (params.backbone, *((name, getattr(params, name, None)) for name in backbone_class(params.backbone).options))


def backbone_class(name: str) -> type[Backbone]:
    try:
        return BACKBONES[name]
    except KeyError:
        raise UserError(f"unknown backbone {name!r}; choose from {', '.join(BACKBONES)}") from None
