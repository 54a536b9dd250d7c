r"""H2GCN with K = 2 rounds (Zhu et al., NeurIPS 2020), FedGMC's backbone, and its ego-activation variants.

.. math::
    r_0 = \sigma(X W_{ego}^\top), \qquad
    r_1 = [A_1 r_0 \,\|\, A_2 r_0], \qquad
    r_2 = [A_1 r_1 \,\|\, A_2 r_1], \qquad
    \mathrm{logits} = \mathrm{dropout}([r_0 \,\|\, r_1 \,\|\, r_2])\, W_C^\top

with the normalised 1-hop and strict 2-hop operators :math:`A_1, A_2` (`graph_ops.h2gcn_adjacencies`,
attached as `hop1_adj`, `hop2_adj`; the 2-hop one dense where that is no larger). No bias, as in the
official code. Shapes: X [N, F] → r_0 [N, h] → r_1 [N, 2h] → r_2 [N, 4h] → combined [N, 7h] → logits
[N, C]; with a leading client axis M on the batched path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch_geometric.data import Data

from gflbench.backbones.base import GraphPass, StackedBackbone, register_backbone
from gflbench.backbones.graph_ops import h2gcn_adjacencies


@dataclass(frozen=True)
class H2GCNRepresentations:
    """H2GCN's intermediate representations, which FedGMC calibrates; each `[N, ·]` (`[M, N, ·]` stacked)."""

    ego: Tensor  # r0 = σ(X W_ego), structure-free (σ = ReLU unless a variant says otherwise)
    hop1: Tensor  # normalised 1-hop aggregation of ego embeddings
    hop2: Tensor  # normalised strict 2-hop aggregation of ego embeddings
    combined: Tensor  # [r0 || r1 || r2], the classifier's input


class H2GCN(StackedBackbone):
    """H2GCN with K=2 rounds (official `M64-R-T1-G-V-T2-G-V-C1-C2-D0.5-MO`); equation above.

    Ego and neighbour embeddings are kept apart, and the classifier reads [r0 || r1 || r2]. The ego
    activation σ is ReLU (the official `R`); the registered variants `h2gcn-tanh` and `h2gcn-elu` swap
    it, because FedGMC's paper only says "a non-linear activation" and ReLU's non-negative embeddings
    cannot reach its anchors (docs/fedgmc.md, "Ego activation"). `network` returns the
    representations beside the logits, which FedGMC's objective reads on both paths.
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

    def encode(self, p: Mapping[str, Tensor], g: GraphPass) -> H2GCNRepresentations:
        ego = EGO_ACTIVATIONS[self.activation](g.features(p["ego.weight"]))
        hop1, hop2 = g.propagate("hop1_adj", ego), g.propagate("hop2_adj", ego)
        r1 = torch.cat([hop1, hop2], dim=-1)
        r2 = torch.cat([g.propagate("hop1_adj", r1), g.propagate("hop2_adj", r1)], dim=-1)
        return H2GCNRepresentations(ego, hop1, hop2, torch.cat([ego, r1, r2], dim=-1))

    def network(self, p: Mapping[str, Tensor], g: GraphPass) -> tuple[Tensor, H2GCNRepresentations]:
        reps = self.encode(p, g)
        return g.linear(g.dropout(reps.combined), p["classifier.weight"]), reps

    def representations(self, graph: Data) -> H2GCNRepresentations:
        return self.encode(self.weights(), self.client_pass(graph))

    def embed(self, graph: Data) -> Tensor:
        return self.representations(graph).combined


EGO_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "tanh": torch.tanh, "elu": F.elu}


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
