"""The GNN backbones the methods train, one module each, and their registry.

Each backbone names its classification head (`head`), which personalised methods keep local, and
declares the graph operators it needs (`prepare`), computed once per client before training.
Importing this package registers every backbone under its name (`BACKBONES`), in this order.
"""

# ruff: noqa: I001  (the import order below is the order in which `BACKBONES` lists the backbones)

from gflbench.backbones.base import (
    BACKBONES,
    Backbone,
    ClientPass,
    GraphPass,
    StackedBackbone,
    backbone_class,
    build_backbone,
    input_layer,
    prepared_key,
    register_backbone,
)
from gflbench.backbones.gcn import GCN
from gflbench.backbones.sage import GraphSAGE
from gflbench.backbones.h2gcn import EGO_ACTIVATIONS, FEDGMC_BACKBONE, H2GCN, H2GCNRepresentations
from gflbench.backbones.gamlp import GAMLP
from gflbench.backbones.unifilter import (
    UniFilter,
    UniFilterCode,
    train_homophily,
    unibasis,
    unifilter_adjacency,
    unifilter_components,
)
from gflbench.backbones.disengcn import ROUTING_KERNELS, DisenGCN, neighbourhood_routing

__all__ = [
    "BACKBONES",
    "EGO_ACTIVATIONS",
    "FEDGMC_BACKBONE",
    "GAMLP",
    "GCN",
    "H2GCN",
    "ROUTING_KERNELS",
    "Backbone",
    "ClientPass",
    "DisenGCN",
    "GraphPass",
    "GraphSAGE",
    "H2GCNRepresentations",
    "StackedBackbone",
    "UniFilter",
    "UniFilterCode",
    "backbone_class",
    "build_backbone",
    "input_layer",
    "neighbourhood_routing",
    "prepared_key",
    "register_backbone",
    "train_homophily",
    "unibasis",
    "unifilter_adjacency",
    "unifilter_components",
]
