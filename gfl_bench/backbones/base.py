"""What every backbone is (`Backbone`), the first layer they share (`input_layer`), and the registry of
backbones by name (`BACKBONES`, `register_backbone`, `build_backbone`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch_geometric.data import Data

from gfl_bench.errors import UserError


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


def prepared_key(params: Any) -> tuple:
    """What a prepared graph depends on: the backbone and the values of its `options`."""
    return (params.backbone, *((name, getattr(params, name, None)) for name in backbone_class(params.backbone).options))


def backbone_class(name: str) -> type[Backbone]:
    try:
        return BACKBONES[name]
    except KeyError:
        raise UserError(f"unknown backbone {name!r}; choose from {', '.join(BACKBONES)}") from None
