"""UniFilter as FedGSP, FedICI and FedSSA train it, and its basis construction."""

from __future__ import annotations

import itertools
import math
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch_geometric.data import Data
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from gflbench.backbones.base import Backbone, register_backbone
from gflbench.backbones.dropout import dropout
from gflbench.errors import UserError


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
