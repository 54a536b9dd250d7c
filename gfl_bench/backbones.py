"""The GNN backbones the methods train: the 2-layer GCN + classifier of the FED-PUB protocol and H2GCN.

Each backbone names its classification head (`head`), which personalised methods keep local, and
declares the graph operators it needs (`prepare`), computed once per client before training.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch_geometric.data import Data
from torch_geometric.nn import GCNConv, SAGEConv
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from gfl_bench.dropout import dropout
from gfl_bench.errors import UserError
from gfl_bench.graph_ops import (
    EdgeOperators,
    binary_adjacency,
    edge_dots,
    edge_weighted_sum,
    gcn_adjacency,
    h2gcn_adjacencies,
)


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
        h = F.relu(
            self.conv1.propagate(graph.gcn_adj, x=input_layer(graph, self.conv1.lin), edge_weight=None)
            + self.conv1.bias
        )
        h = dropout(h, self.dropout, self.training)
        return self.conv2(h, graph.gcn_adj)

    def forward(self, graph: Data) -> Tensor:
        h = dropout(F.relu(self.embed(graph)), self.dropout, self.training)
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
        h = dropout(F.relu(self.conv1(graph.x, graph.adj)), self.dropout, self.training)
        return self.conv2(h, graph.adj)

    def forward(self, graph: Data) -> Tensor:
        h = dropout(F.relu(self.embed(graph)), self.dropout, self.training)
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
    return (params.backbone, *((name, getattr(params, name, None)) for name in backbone_class(params.backbone).options))


def backbone_class(name: str) -> type[Backbone]:
    try:
        return BACKBONES[name]
    except KeyError:
        raise UserError(f"unknown backbone {name!r}; choose from {', '.join(BACKBONES)}") from None


class GAMLP(Backbone):
    """GAMLP in the simplified form FedGTA trains (SimGAMLP; Zhang et al., KDD 2022; official FedGTA
    `gnn_model/scalable/{sim_gamlp,simple_models}.py`, `operators/message_operator/.../sim_learnable_weighted_messahe_op.py`).

    Propagation, once per client (`prepare`): X⁽ᵏ⁾ = Âᵏ X for k = 0..K, Â = D̃^-1/2 (A + I) D̃^-1/2
    (the official r = 0.5), K = `gamlp_steps`. Node-wise hop attention (the official "jk" combination):
        s_k(v) = σ(aᵀ [X⁽⁰⁾_v ∥ … ∥ X⁽ᴷ⁾_v ∥ X⁽ᵏ⁾_v] + b),  α(v) = softmax_k s_k(v),  X̄_v = Σ_k α_k(v) X⁽ᵏ⁾_v,
    then an MLP of L = `gamlp_layers` layers: (L − 1) × [Linear → PReLU (one shared slope) → dropout],
    and the head `classifier` (Linear to C). Weights Xavier-uniform with ReLU gain, zero biases, as in
    the official MLP. The official code reshapes the hop scores hop-major into a node-major view, so a
    node's weights come from other nodes' scores; here each node attends over its own hops (the
    equation above; docs/baselines/fedgta.md).

    Shapes: hops [N, K+1, F] (node-major: each node's hops lie together) → X̄ [N, F] → embed [N, hidden]
    → logits [N, C].
    """

    options = ("gamlp_steps", "gamlp_layers")
    default_steps: ClassVar[int] = 3  # official prop_steps
    default_layers: ClassVar[int] = 3  # official num_layers

    def __init__(
        self, in_dim: int, hidden: int, num_classes: int, dropout: float, steps: int = 3, layers: int = 3
    ) -> None:
        super().__init__(in_dim, hidden, num_classes, dropout)
        if steps < 0 or layers < 2:
            raise UserError(f"GAMLP needs gamlp_steps >= 0 and gamlp_layers >= 2, got {steps} and {layers}")
        self.steps = steps
        self.hop_attention = nn.Linear((steps + 2) * in_dim, 1)  # a, b over [X⁽⁰⁾ ∥ … ∥ X⁽ᴷ⁾ ∥ X⁽ᵏ⁾]
        widths = [in_dim] + [hidden] * (layers - 1)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(widths))
        self.act = nn.PReLU()
        self.classifier = nn.Linear(hidden, num_classes)
        for linear in (*self.layers, self.classifier):
            nn.init.xavier_uniform_(linear.weight, gain=nn.init.calculate_gain("relu"))
            nn.init.zeros_(linear.bias)

    @classmethod
    def from_params(cls, in_dim: int, num_classes: int, params: Any) -> Backbone:
        steps = getattr(params, "gamlp_steps", cls.default_steps)
        layers = getattr(params, "gamlp_layers", cls.default_layers)
        return cls(in_dim, params.hidden, num_classes, params.dropout, steps, layers)

    @staticmethod
    def prepare(graph: Data, params: Any = None) -> None:
        """Attach `gcn_adj` (Â) and `gamlp_hops`, X⁽ᵏ⁾ = ÂᵏX stacked node-major as [N, K+1, F]."""
        steps = getattr(params, "gamlp_steps", GAMLP.default_steps)
        if "gcn_adj" not in graph:
            graph.gcn_adj = gcn_adjacency(graph.edge_index, graph.num_nodes)
        hops = [graph.x.float()]
        for _ in range(steps):
            hops.append(torch.sparse.mm(graph.gcn_adj, hops[-1]))
        graph.gamlp_hops = torch.stack(hops, dim=1)  # [N, K+1, F]

    def hop_weights(self, hops: Tensor) -> Tensor:
        """α [N, K+1]: each node's softmax over σ(aᵀ[all hops ∥ hop k] + b)."""
        num_nodes, num_hops, dim = hops.shape
        if num_hops != self.steps + 1:
            raise ValueError(f"GAMLP built for {self.steps} steps got {num_hops - 1} propagated hops")
        a = self.hop_attention.weight.view(-1)
        a_all, a_own = a[: num_hops * dim], a[num_hops * dim :]
        shared = hops.reshape(num_nodes, -1) @ a_all  # aᵀ[X⁽⁰⁾_v ∥ … ∥ X⁽ᴷ⁾_v], [N]
        scores = torch.sigmoid(shared.unsqueeze(1) + hops @ a_own + self.hop_attention.bias)  # [N, K+1]
        return torch.softmax(scores, dim=1)

    def embed(self, graph: Data) -> Tensor:
        hops = graph.gamlp_hops
        h = torch.bmm(self.hop_weights(hops).unsqueeze(1), hops).squeeze(1)  # X̄ = Σ_k α_k X⁽ᵏ⁾, [N, F]
        for layer in self.layers:
            h = dropout(self.act(layer(h)), self.dropout, self.training)
        return h

    def forward(self, graph: Data) -> Tensor:
        return self.classifier(self.embed(graph))


register_backbone("gamlp", GAMLP)


def unifilter_adjacency(edge_index: Tensor, num_nodes: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """UniFilter's propagation matrix Â = D^-1/2 A D^-1/2: A symmetrised, unit weights, no self-loops
    (official `edgeindex_construct`); an isolated node's row and column are zero. Sparse CSR [N, N].
    The normalisation is PyG's `gcn_norm` without self-loops, as `gcn_adjacency`'s with them."""
    row, col = edge_index
    keep = row != col
    pairs = torch.cat([torch.stack([row[keep], col[keep]]), torch.stack([col[keep], row[keep]])], dim=1)
    pairs = torch.unique(pairs, dim=1)  # [2, E], both directions once
    pairs, values = gcn_norm(pairs, None, num_nodes, add_self_loops=False, dtype=dtype)
    return torch.sparse_coo_tensor(pairs, values, (num_nodes, num_nodes)).coalesce().to_sparse_csr()


def train_homophily(
    edge_index: Tensor, y: Tensor, train_mask: Tensor, rule: str = "paper", empty: float = 0.75
) -> float:
    """ĥ: the edge homophily among edges whose both ends are training nodes (labels of train nodes only).

    Edges are counted in both directions, self-loops dropped. `rule="code"` reproduces FedGSP's
    `homocal`, which takes as sources the node ids 0 … n_train − 1 instead of the training nodes (ends
    still must be training nodes). With no qualifying edge, ĥ = `empty` (FedGSP's 0.75).
    """
    row, col = edge_index
    keep = row != col
    pairs = torch.unique(
        torch.cat([torch.stack([row[keep], col[keep]]), torch.stack([col[keep], row[keep]])], 1), dim=1
    )
    src, dst = pairs
    train = train_mask.bool()
    source_ok = src < int(train.sum()) if rule == "code" else train[src]
    counted = source_ok & train[dst]
    if not bool(counted.any()):
        return empty
    return float((y[src[counted]] == y[dst[counted]]).double().mean())


def _unit_columns(x: Tensor) -> Tensor:
    """Each column over its Euclidean norm; the norm is clamped at 1e-8 as in the official code."""
    return x / x.norm(dim=0).clamp(min=1e-8)


def unifilter_components(
    adj: Tensor, x: Tensor, levels: int, homophily: float, tau: float = 1.0, rule: str = "paper"
) -> tuple[Tensor, Tensor]:
    """UniFilter's homophily bases u_k = Âᵏ X and heterophily bases g_k, k = 1 … K, column by column.

    Heterophily basis (Huang et al., ICML 2024, Algorithm 1), per feature column x, θ = π(1 − ĥ)/2:
        v₀ = g₀ = x/‖x‖,  v_k = normalise(Â v_{k−1} − ⟨Â v_{k−1}, v_{k−1}⟩ v_{k−1} − ⟨Â v_{k−1}, v_{k−2}⟩ v_{k−2})
        s_k = Σ_{j<k} g_j,  t_k = sqrt( (⟨s_k, g_{k−1}⟩ / (k cos θ))² − ((k − 1) cos θ + 1)/k )
        g_k = normalise(s_k/k + t_k v_k)
    so that every g_k makes the angle θ with each earlier g_j (v_k is orthogonal to all of them).
    t_k² < 0 (rounding, or a column with no signal) gives t_k = 0, as the official NaN → 0.
    `rule="code"`: the official code (UniFilter `utils.load_dataset`, FedGSP `core/utils.py`) takes
    ⟨s_k, b_{k−1}⟩ with the previous *mixed* basis b_{k−1} = τu_{k−1} + (1 − τ)g_{k−1}, b₀ = X unnormalised,
    in place of ⟨s_k, g_{k−1}⟩; so the angle θ holds only for τ = 0 and k ≥ 2.
    u_k is not normalised (the official code computes the norm but does not apply it).

    Shapes: adj [N, N] sparse, x [N, F] → (u [K, N, F], g [K, N, F]), in x's dtype.
    """
    if rule not in ("paper", "code"):
        raise ValueError(f"unknown UniFilter basis rule {rule!r}")
    cos = max(math.cos(math.pi * (1.0 - homophily) / 2.0), 1e-12)
    adj = adj.to(x.dtype)
    v_prev = torch.zeros_like(x)
    v = _unit_columns(x)  # v₀ [N, F]
    g = v  # g₀
    basis_sum = g.clone()  # s_1 = g₀
    previous_mixed = x  # b₀ (code rule)
    u = x
    homophily_bases, heterophily_bases = [], []
    for k in range(1, levels + 1):
        w = torch.sparse.mm(adj, v)
        w = w - (w * v).sum(0) * v - (w * v_prev).sum(0) * v_prev
        w = _unit_columns(w)  # v_k
        u = torch.sparse.mm(adj, u)  # u_k = Â u_{k−1}
        reference = g if rule == "paper" else previous_mixed
        t_sq = ((basis_sum * reference).sum(0) / (k * cos)) ** 2 - ((k - 1) * cos + 1) / k
        t = torch.nan_to_num(t_sq.clamp(min=0).sqrt(), nan=0.0)  # [F]
        g = _unit_columns(basis_sum / k + t * w)  # g_k
        homophily_bases.append(u)
        heterophily_bases.append(g)
        previous_mixed = tau * u + (1.0 - tau) * g
        basis_sum = basis_sum + g
        v_prev, v = v, w
    if not homophily_bases:
        empty = x.new_zeros((0, *x.shape))
        return empty, empty.clone()
    return torch.stack(homophily_bases), torch.stack(heterophily_bases)


def unibasis(x: Tensor, homophily_bases: Tensor, heterophily_bases: Tensor, tau: float) -> Tensor:
    """The UniBasis b₀ = X, b_k = τ u_k + (1 − τ) g_k (k = 1 … K). [N, F], 2 × [K, N, F] → [K+1, N, F]."""
    return torch.cat([x.unsqueeze(0), tau * homophily_bases + (1.0 - tau) * heterophily_bases])


class UniFilter(Backbone):
    """UniFilter (Huang et al., "How Universal Polynomial Bases Enhance Spectral Graph Neural Networks:
    Heterophily, Over-smoothing, and Over-squashing", ICML 2024; official `kkhuang81/UniFilter`
    `{utils,models}.py`), with the per-level, per-feature filter weights FedICI trains
    (`blgpb/FedGSP` `core/model.py::GFK`).

    Bases, once per client (`prepare`; graph only, plus ĥ from the training labels):
        u_k = Âᵏ X (homophily),  g_k (heterophily, angle θ = π(1 − ĥ)/2 to each other; `unifilter_components`),
        b₀ = X,  b_k = τ u_k + (1 − τ) g_k   (k = 1 … K),   Â = D^-1/2 A D^-1/2 without self-loops.
    Filter and MLP, every forward:
        Z = Σ_{k=0..K} w_k ⊙ dropout_C(b_k)        (w_k ∈ R^F: `level_weights[k]`, init 1/(K+1))
        H = ReLU(D W₁ [+ D]),  H ← ReLU(D W_l + D) with D = dropout(H)   (l = 2 … L−1)
        logits = dropout(H) W_C   (`classifier`)
    All dense layers have no bias and are initialised U(±1/sqrt(out)), as the official `Dense`, which
    adds its (dropped-out) input wherever input and output widths agree: always for W_2 … W_{L−1}, for
    W₁ only when F = hidden; not for the head here (it would need hidden = C). Central UniFilter shares one scalar per level (`--sole`); FedICI's w_k is per feature.

    Params read: `levels` (K) and `tau` (τ), both in `options` (bases depend on them); `hidden`,
    `dropout` (the MLP's dropout_M); optional `mlp_layers` (L ≥ 2, default 3) and `filter_dropout`
    (dropout_C, default 0.3), whose absence leaves the defaults. `basis_rule` "paper" (this class) or
    "code" (`unifilter-code`): see `unifilter_components` and `train_homophily`.

    Shapes: bases [K+1, N, F] → Z [N, F] (`filtered`) → H [N, hidden] (`embed`) → logits [N, C].
    """

    options = ("levels", "tau")
    basis_rule: ClassVar[str] = "paper"
    default_levels: ClassVar[int] = 10  # K: FedGSP `core/config.py` and UniFilter `script.sh` default
    default_tau: ClassVar[float] = 0.95  # τ: FedGSP `core/config.py` default

    def __init__(
        self, in_dim: int, hidden: int, num_classes: int, dropout: float,
        levels: int = 10, mlp_layers: int = 3, filter_dropout: float = 0.3,
    ) -> None:  # fmt: skip
        super().__init__(in_dim, hidden, num_classes, dropout)
        if levels < 0 or mlp_layers < 2:
            raise UserError(f"UniFilter needs levels >= 0 and mlp_layers >= 2, got {levels} and {mlp_layers}")
        self.levels = levels
        self.filter_dropout = filter_dropout
        self.level_weights = nn.Parameter(torch.full((levels + 1, in_dim), 1.0 / (levels + 1)))  # [K+1, F]
        widths = [in_dim] + [hidden] * (mlp_layers - 1)
        self.layers = nn.ModuleList(nn.Linear(a, b, bias=False) for a, b in itertools.pairwise(widths))
        self.classifier = nn.Linear(hidden, num_classes, bias=False)
        for linear in [*self.layers, self.classifier]:
            bound = 1.0 / math.sqrt(linear.out_features)
            nn.init.uniform_(linear.weight, -bound, bound)

    @classmethod
    def from_params(cls, in_dim: int, num_classes: int, params: Any) -> Backbone:
        return cls(
            in_dim, params.hidden, num_classes, params.dropout, levels=getattr(params, "levels", cls.default_levels),
            mlp_layers=getattr(params, "mlp_layers", 3), filter_dropout=getattr(params, "filter_dropout", 0.3),
        )  # fmt: skip

    @classmethod
    def components(cls, graph: Data, params: Any = None) -> tuple[float, Tensor, Tensor]:
        """(ĥ, u [K, N, F], g [K, N, F]) of one client graph, in float64: what `prepare` mixes into the bases.

        ĥ reads the labels of training nodes only; a graph without `train_mask` (or `y`) gets 0.75.
        Without Params, K and τ take the class defaults.
        """
        levels = getattr(params, "levels", cls.default_levels)
        tau = getattr(params, "tau", cls.default_tau)
        if "train_mask" in graph and "y" in graph:
            homophily = train_homophily(graph.edge_index, graph.y, graph.train_mask, cls.basis_rule)
        else:
            homophily = 0.75
        adj = unifilter_adjacency(graph.edge_index, graph.num_nodes)
        u, g = unifilter_components(adj, graph.x.to(torch.float64), levels, homophily, tau, cls.basis_rule)
        return homophily, u, g

    @classmethod
    def prepare(cls, graph: Data, params: Any = None) -> None:
        """Attach `unifilter_bases` [K+1, N, F] (float32) and `unifilter_homophily` (ĥ, a 0-d tensor)."""
        homophily, u, g = cls.components(graph, params)
        bases = unibasis(graph.x.to(torch.float64), u, g, getattr(params, "tau", cls.default_tau))
        graph.unifilter_bases = bases.to(graph.x.dtype)  # [K+1, N, F]
        graph.unifilter_homophily = torch.tensor(homophily)

    def filtered(self, graph: Data) -> Tensor:
        """Z = Σ_k w_k ⊙ dropout_C(b_k), the filtered signal before the MLP. [N, F]"""
        bases = dropout(graph.unifilter_bases, self.filter_dropout, self.training)  # [K+1, N, F]
        return (bases * self.level_weights.unsqueeze(1)).sum(0)

    def embed(self, graph: Data) -> Tensor:
        """H, the MLP's last hidden layer before the head's dropout. [N, hidden]"""
        h = self.filtered(graph)
        for layer in self.layers:
            h = dropout(h, self.dropout, self.training)
            h = F.relu(layer(h) + h if layer.in_features == layer.out_features else layer(h))
        return h

    def forward(self, graph: Data) -> Tensor:
        return self.classifier(dropout(self.embed(graph), self.dropout, self.training))


class UniFilterCode(UniFilter):
    """UniFilter with the official code's basis construction: t_k from the previous mixed basis
    (b₀ = X unnormalised) and FedGSP's `homocal` (source ids 0 … n_train − 1); see `unifilter_components`."""

    basis_rule = "code"


register_backbone("unifilter", UniFilter)
register_backbone("unifilter-code", UniFilterCode)


ROUTING_KERNELS = ("gather", "sparse")


def neighbourhood_routing(
    z: Tensor, edge_index: Tensor, iterations: int, tau: float = 1.0, kernel: str = "gather",
    operators: EdgeOperators | None = None,
) -> Tensor:  # fmt: skip
    """One parameter-free DisenConv layer (Ma et al., ICML 2019, Alg. 1; FedIIH appendix A, Eqs. 1-2).

    ẑ_{i,k} = z_{i,k} / ‖z_{i,k}‖; c_{u,k} starts at ẑ_{u,k}; then `iterations` times, for every edge v → u:
        p_{v,k} = softmax_k(ẑ_{v,k}ᵀ c_{u,k} / τ),   c_{u,k} = normalise(ẑ_{u,k} + Σ_{v→u} p_{v,k} ẑ_{v,k}).
    No N × N matrix either way; an isolated node returns ẑ_u. Two kernels for the same arithmetic:
    - "gather": vectorised over edges (both ends of every edge gathered [E, K, h], index_add);
    - "sparse": factor-major, the edge terms as sampled and CSR products per factor
      (`graph_ops.edge_dots`, `edge_weighted_sum`), memory E·K + N·K·h; several times faster on a
      CPU (docs/baselines/fediih.md, "Cost"). Its float rounding differs (outputs agree to about
      1e-7), which FedIIH's first round amplifies, so a run's numbers depend on the kernel.
      `operators` is its CSR structure of `edge_index` (`graph_ops.EdgeOperators`), for a caller that
      keeps it across calls (`DisenGCN` does, per graph); built here otherwise.
    Shapes: z [N, K, h], edge_index [2, E] (row 0 = source v, row 1 = target u) → c [N, K, h].
    """
    if kernel == "sparse":
        return _sparse_routing(z, edge_index, iterations, tau, operators)
    unit = F.normalize(z, dim=2)  # ẑ [N, K, h]
    source, target = edge_index
    neighbour = unit.index_select(0, source)  # ẑ_v per edge [E, K, h]
    centre = unit
    for _ in range(iterations):
        affinity = (neighbour * centre.index_select(0, target)).sum(dim=2) / tau  # [E, K]
        p = torch.softmax(affinity, dim=1)  # over factors, per edge
        centre = F.normalize(unit.index_add(0, target, neighbour * p.unsqueeze(2)), dim=2)  # [N, K, h]
    return centre


def _sparse_routing(
    z: Tensor, edge_index: Tensor, iterations: int, tau: float, operators: EdgeOperators | None
) -> Tensor:
    """`neighbourhood_routing`'s "sparse" kernel: the same steps on factor-major [K, N, h] tensors."""
    unit = F.normalize(z, dim=2).transpose(0, 1).contiguous()  # ẑ [K, N, h]
    if iterations == 0 or edge_index.shape[1] == 0:
        return unit.transpose(0, 1)
    ops = operators if operators is not None else EdgeOperators(edge_index, z.shape[0])
    centre = unit
    for _ in range(iterations):
        p = torch.softmax(edge_dots(centre, unit, ops) / tau, dim=1)  # [E, K], over factors per edge
        centre = F.normalize(unit + edge_weighted_sum(p, unit, ops), dim=2)  # [K, N, h]
    return centre.transpose(0, 1)


class DisenGCN(Backbone):
    """DisenGCN as FedIIH trains it (Ma et al., ICML 2019; FedIIH `FedIIH_K/models/nets.py::DisentangledGNN`).

    Projection into K factor channels, then L_b parameter-free routing layers, then the head:
        z_{i,k} = LeakyReLU(W_k x_i + b_k)                                 (dropout after)
        c = routing(z) (`neighbourhood_routing`: ẑ unit-normalised per factor, T iterations,
            p_{v,k} = softmax_k(ẑ_{v,k}ᵀ c_{u,k}/τ), c_{u,k} = normalise(ẑ_{u,k} + Σ_v p_{v,k} ẑ_{v,k})),
            each layer followed by LeakyReLU and dropout
        logits = W_cls [c_{·,1} ∥ … ∥ c_{·,K}] + b_cls.
    K = `factors`, T = `routing_iters`, τ = `routing_tau` (1 in FedIIH), h = `hidden` (per factor; the
    official `n_latentdims`); `routing_kernel` picks `neighbourhood_routing`'s kernel. `variational` adds FedIIH's two encoder heads (μ and log σ², Appendix E):
    each is a further stack of routing layers on the shared base output, so the heads add no parameters.
    `routing_layers` = L is FedIIH's `n_layers` ("# neighborhood routing layers", Tables 3-4), split as
    the official code does: L ≤ 2 gives 1 base layer and 1 per head, L > 2 gives L − 2 base layers and
    2 per head. Projection weights are uniform in ±1/sqrt(K·h) (official `SparseInputLinear`).

    Shapes: x [N, F] → z [N, K, h] → c [N, K, h] → embed [N, K·h] → logits [N, C].
    """

    options = ("factors", "routing_layers", "routing_iters", "routing_tau", "routing_kernel")
    # The axis of each parameter that holds K consecutive factor blocks of width h (FedIIH aggregates
    # them factor by factor); parameters not listed (the classifier bias) have no factor structure.
    factor_axes: ClassVar[dict[str, int]] = {"projection.weight": 0, "projection.bias": 0, "classifier.weight": 1}
    defaults: ClassVar[dict[str, Any]] = {
        "factors": 2, "routing_layers": 5, "routing_iters": 6, "routing_tau": 1.0, "routing_kernel": "gather",
    }  # fmt: skip
    checkpoint_above: ClassVar[int] = (
        2**24
    )  # E·K·h above which routing layers are recomputed for backward (64 MB per gather)

    def __init__(
        self, in_dim: int, hidden: int, num_classes: int, dropout: float, factors: int = 2, base_layers: int = 1,
        head_layers: int = 1, iterations: int = 6, tau: float = 1.0, kernel: str = "gather",
    ) -> None:  # fmt: skip
        super().__init__(in_dim, hidden, num_classes, dropout)
        if factors < 1 or base_layers < 0 or head_layers < 0 or iterations < 0 or tau <= 0:
            raise UserError(
                f"DisenGCN needs factors >= 1, layers and iterations >= 0 and tau > 0; got K={factors}, "
                f"layers {base_layers}/{head_layers}, T={iterations}, tau={tau}"
            )
        if kernel not in ROUTING_KERNELS:
            raise UserError(f"routing_kernel must be one of {', '.join(ROUTING_KERNELS)}; got {kernel!r}")
        self.kernel = kernel
        self._operators: tuple[Tensor, EdgeOperators] | None = None  # the sparse kernel's, for one edge_index
        self.factors, self.factor_dim = factors, hidden
        self.base_layers, self.head_layers = base_layers, head_layers
        self.iterations, self.tau = iterations, tau
        self.projection = nn.Linear(in_dim, factors * hidden)  # W = [W_1; …; W_K], [K·h, F]
        bound = 1.0 / math.sqrt(factors * hidden)
        nn.init.uniform_(self.projection.weight, -bound, bound)
        nn.init.uniform_(self.projection.bias, -bound, bound)
        self.classifier = nn.Linear(factors * hidden, num_classes)

    @classmethod
    def from_params(cls, in_dim: int, num_classes: int, params: Any) -> Backbone:
        value = {name: getattr(params, name, default) for name, default in cls.defaults.items()}
        layers = value["routing_layers"]
        base, head = (1, 1) if layers <= 2 else (layers - 2, 2)
        return cls(
            in_dim, params.hidden, num_classes, params.dropout, value["factors"], base, head,
            value["routing_iters"], value["routing_tau"], value["routing_kernel"],
        )  # fmt: skip

    def _activate(self, h: Tensor) -> Tensor:
        return dropout(F.leaky_relu(h), self.dropout, self.training)

    def _route(self, z: Tensor, graph: Data, layers: int) -> Tensor:
        from torch.utils.checkpoint import checkpoint

        # The gather kernel's autograd would keep T gathered [E, K, h] tensors per layer; on large clients
        # (arxiv-sized: GBs) each layer is recomputed in the backward pass instead (same numbers, one
        # extra forward). The sparse kernel keeps none.
        gathers = self.kernel == "gather" and graph.edge_index.shape[1] * z[0].numel() > self.checkpoint_above
        recompute = z.requires_grad and gathers
        operators = self._edge_operators(graph.edge_index, z.shape[0]) if self.kernel == "sparse" else None
        for _ in range(layers):
            args = (z, graph.edge_index, self.iterations, self.tau, self.kernel, operators)
            z = (
                checkpoint(neighbourhood_routing, *args, use_reentrant=False)
                if recompute
                else neighbourhood_routing(*args)
            )
            z = self._activate(z)
        return z

    def _edge_operators(self, edge_index: Tensor, num_nodes: int) -> EdgeOperators:
        """The sparse kernel's CSR structure of the client's graph, built at its first forward and kept
        (the graph is fixed; every routing layer of every step would otherwise sort its edges again)."""
        cached = self._operators
        if cached is None or cached[0] is not edge_index or cached[1].num_nodes != num_nodes:
            self._operators = cached = (edge_index, EdgeOperators(edge_index, num_nodes))
        return cached[1]

    def factor_embeddings(self, graph: Data) -> Tensor:
        """The base output c after the L_b routing layers, per factor. [N, K, h]"""
        z = self._activate(input_layer(graph, self.projection)).view(-1, self.factors, self.factor_dim)  # [N, K, h]
        return self._route(z, graph, self.base_layers)

    def embed(self, graph: Data) -> Tensor:
        return self.factor_embeddings(graph).flatten(1)  # [N, K·h]

    def forward(self, graph: Data) -> Tensor:
        return self.classifier(self.embed(graph))

    def variational(self, graph: Data) -> tuple[Tensor, Tensor]:
        """FedIIH's encoder: (μ, log σ²) per node and factor, each [N, K, h], from the shared base output."""
        base = self.factor_embeddings(graph)
        return self._route(base, graph, self.head_layers), self._route(base, graph, self.head_layers)


register_backbone("disengcn", DisenGCN)
