"""FedICI ("Integrating Commonality and Individuality for Graph Federated Learning: A Graph Spectrum
Perspective"; official code `blgpb/FedGSP`, `main.py`, `core/{utils,model,config}.py`; the repository's
README named it FedICI at commit 8b2dbb4): personalised aggregation over client graphs learnt from the
spectral subspaces of each client's UniFilter bases.

Shapes: rows are clients (M), K levels, q principal directions, F features, D = F per level or K·F
for the concatenation of all levels.

  Client i, once: ĥ_i from its training labels; UniFilter homophily bases u_k = Âᵏ X and heterophily
  bases g_k (k = 1 … K; `gflbench.backbones.UniFilter`); the top-q principal directions (centred PCA)
  of every u_k and g_k, P_i^(k), Q_i^(k) ∈ R^{q×F}, and of the concatenations [u_1 … u_K], [g_1 … g_K],
  P_i, Q_i ∈ R^{q×KF}.
  Client i, each round, given θ̃_i: loads θ̃_i, trains its UniFilter model (Adam with two groups: MLP
  lr/weight_decay, filter weights filter_lr/filter_weight_decay), uploads θ_i and, in the first
  `graph_rounds` rounds, its subspaces.
  Server, rounds < `graph_rounds`, for every level k with (P, Q) = (P^(k), Q^(k)), and once more for
  the concatenations, from the previous client graph W (initially 1/(M−1) off the diagonal):
      L = diag(W̄1) − W̄,  W̄ = (W + Wᵀ)/2;  r_d ∝ 1/(Pᵀ L P)_dd,  s_d ∝ 1/(Qᵀ L Q)_dd  (P, Q flattened [M, qD])
      cP_ij = cos(mean principal angle between rows of P_i ⊙ r and of P_j ⊙ r)   (similar low frequency)
      cQ_ij = cos(mean principal angle between rows of Q_i ⊙ s and of Q_j ⊙ s)   (complementary high frequency)
      t_ij = α cQ_ij − β cP_ij
      W_i = argmin_{w ∈ Δ^M} Σ_j t_ij w_j + γ ‖w‖²  = Π_Δ(h_i),  h_ij = 1/M − t_ij/(2γ) + Σ_l t_il/(2Mγ)
  then (every round) θ̃_i = Σ_j W_ij θ_j for every parameter except the filter weights, whose level 0
  row uses W and level k ≥ 1 row uses W^(k).

Choices and differences from the official code (docs/baselines/fedici.md):
- `graph_rule="paper"` (the Params default) is the math above. `graph_rule="code"` reproduces
  `core/utils.py::Update_W`: P ⊙ r reshaped from its [qD, M] transpose without transposing back (client
  rows mixed), principal angles by greedy matching of row cosines and averaged with a hard-coded 1/3, h
  symmetrised with the row sum of min(i, j), and W_i = ReLU(h_i − b_i) with b_i one Newton step from 0
  (rows need not sum to 1).
- Backbone `unifilter` (the Params default) builds the bases as UniFilter's Algorithm 1; `unifilter-code`
  as the official code (t_k from the previous mixed basis, `homocal`'s index bug). Bases and subspaces
  depend only on the client graph: computed once (the code recomputes them every round, identically).
- The `paper` protocol runs the released code's two readings (`graph_rule=code`, `unifilter-code`), which
  produced the published cells, with `core/config.py`'s values (gfl_bench/experiments/presets/fedici.csv); each
  reading switches back on its own (`--set fedici.graph_rule=paper`, `--set fedici.backbone=unifilter`).
- PCA by block subspace iteration (seeded by Setup.seed and the client id) instead of a full SVD: the
  same top-q directions to ~1e-10 on our data, without O(N·D·min(N, D)) work on large clients.
- Evaluation as every method here (protocol §1.3): client-mean at the best client-mean validation
  round. The code keeps each client's test value at its own best validation round, which is our
  table option `--selection per-client`.
- BCE with one logit on binary datasets in the code; 2 logits and cross-entropy here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor
from torch_geometric.data import Data

from gflbench.backbones import UniFilter, backbone_class
from gflbench.core.aggregation import load_model_state, model_state
from gflbench.core.method import (
    SHARED_SEARCH_SPACE,
    Message,
    Method,
    MethodParams,
    Round,
    Server,
    Setup,
    at_least,
    choice,
    float_range,
    int_range,
    log_range,
    non_negative,
    positive,
    unit_interval,
)  # fmt: skip
from gflbench.core.switches import fidelity_switch
from gflbench.core.training import TrainingClient
from gflbench.errors import UserError

GRAPH_RULES = ("paper", "code")
FILTER_KEY = "level_weights"  # UniFilter's per-level, per-feature filter weights [K+1, F]


# The UniFilter values of FedGSP's `core/config.py` reach past the shared ranges (widths 32-1024, weight
# decay up to 5e-3, filter lr up to 0.35); `fair` searches a space that holds every published value
# (tests/test_protocol.py checks it for every method), so these widen the shared ones. FedSSA shares them.
UNIFILTER_CONFIG_SPACE = {
    "weight_decay": log_range(1e-7, 5e-3),
    "hidden": choice(32, 64, 128, 256, 512, 1024),
    "filter_lr": log_range(1e-3, 0.35),
}


@dataclass(frozen=True)
class FedICIParams(MethodParams):
    """FedICI's hyperparameters: FedGSP `core/config.py` parser defaults (research notes §2.13)."""

    search_space = {
        **SHARED_SEARCH_SPACE,  # dropout (the MLP's); lr, weight_decay and hidden widened below
        **UNIFILTER_CONFIG_SPACE,
        "lr": log_range(1e-3, 0.4),  # official per-dataset up to 0.4 (Cora 0.15), above the shared 0.1
        "tau": float_range(0.5, 1.0),  # official per-dataset 0.53-0.998
        "levels": int_range(3, 16),  # official per-dataset 3-16
        "alpha": float_range(0.0, 0.5),  # official per-dataset 0-0.43
        "beta": float_range(1.0, 2.5),  # official per-dataset 1.2-2.5
        "gamma": log_range(1.0, 50.0),  # official per-dataset 1-50
    }
    bounds = {
        "levels": at_least(1), "tau": unit_interval(), "mlp_layers": at_least(2), "filter_dropout": unit_interval(high_open=True),
        "filter_lr": positive(), "filter_weight_decay": non_negative(), "principal_dims": at_least(1),
        "alpha": non_negative(), "beta": non_negative(), "gamma": positive(), "graph_rounds": at_least(0),
    }  # fmt: skip

    # UniFilter "GFK" with per-level, per-feature weights
    backbone: str = fidelity_switch("unifilter", "unifilter: UniFilter's Algorithm 1; unifilter-code: official bases")
    hidden: int = 256  # official default n_latentdims (per dataset 32-1024)
    lr: float = 0.15  # lr1, the MLP's Adam lr; official default (per dataset 0.006-0.4)
    weight_decay: float = 5e-4  # wd1, the MLP's; official default (per dataset 5e-7-5e-3)
    dropout: float = 0.4  # dpM, before every MLP layer; official default (per dataset 0-0.6)
    levels: int = 10  # K, UniFilter levels; official default (per dataset 3-16)
    tau: float = 0.95  # τ in b_k = τu_k + (1−τ)g_k; official default (per dataset 0.53-0.998)
    mlp_layers: int = 3  # L, dense layers including the head; official default (per dataset 3-6)
    filter_dropout: float = 0.3  # dpC, on the bases before the filter; official default (per dataset 0-0.87)
    filter_lr: float = 0.005  # lr2, the filter weights' Adam lr; official default (per dataset 0.005-0.207)
    filter_weight_decay: float = 0.0  # wd2; official default (per dataset 0-0.05)
    principal_dims: int = 3  # q = k_principal, principal directions per subspace; official default (per dataset 1-9)
    alpha: float = (
        0.25  # α = matrix_alpha, weight of heterophily-subspace similarity (penalised); official default (0-0.43)
    )
    beta: float = 1.2  # β = matrix_beta, weight of homophily-subspace similarity (rewarded); official default (1.2-2.5)
    gamma: float = 1.0  # γ, the ‖w‖² regulariser of the graph learning; official default (per dataset 1-50)
    graph_rounds: int = 15  # rounds in which subspaces are sent and the client graphs learnt (official `round < 15`)
    graph_rule: str = fidelity_switch("paper", "paper: the math of the module docstring; code: the official Update_W")

    def __post_init__(self) -> None:
        if not issubclass(backbone_class(self.backbone), UniFilter):
            raise UserError(
                f"FedICI trains UniFilter; backbone must be unifilter or unifilter-code, got {self.backbone!r}"
            )
        if self.graph_rule not in GRAPH_RULES:
            raise UserError(f"graph_rule must be one of {', '.join(GRAPH_RULES)}, got {self.graph_rule!r}")


# ---------------------------------------------------------------------------------------------------
# Client side: principal subspaces of the bases


def principal_directions(
    x: Tensor, q: int, generator: torch.Generator, iterations: int = 12, oversample: int = 10
) -> Tensor:
    """The top-q right singular vectors of the column-centred x (PCA directions), as rows. [N, D] → [q, D].

    Block subspace iteration (Halko, Martinsson & Tropp 2011, Alg. 4.4) with q + `oversample` vectors
    and re-orthonormalisation at every half step, then an exact SVD of the projected [q+p, D] block.
    Directions beyond the rank of x are zero rows. Signs: the largest-magnitude entry of each row is
    positive (deterministic; principal angles do not depend on signs).
    """
    x = x - x.mean(dim=0, keepdim=True)
    n, d = x.shape
    width = min(q + oversample, n, d)
    out = x.new_zeros((q, d))
    if width == 0:
        return out
    omega = torch.randn(d, width, generator=generator, dtype=x.dtype).to(x.device)
    basis = torch.linalg.qr(x @ omega).Q  # [N, width]
    for _ in range(iterations):
        right = torch.linalg.qr(x.T @ basis).Q  # [D, width]
        basis = torch.linalg.qr(x @ right).Q
    _, sigma, vh = torch.linalg.svd(basis.T @ x, full_matrices=False)  # vh [width, D]
    keep = min(q, vh.shape[0])
    rows = vh[:keep] * (sigma[:keep] > 1e-10 * sigma[:1].clamp(min=1e-300)).unsqueeze(1)
    pivot = rows.abs().argmax(dim=1, keepdim=True)
    rows = rows * torch.where(rows.gather(1, pivot) < 0, -1.0, 1.0).to(rows.dtype)
    out[:keep] = rows
    return out


@dataclass(frozen=True)
class Subspaces:
    """A client's principal subspaces: per level [K, q, F] and of all levels concatenated [q, K·F]."""

    homophily_levels: Tensor
    heterophily_levels: Tensor
    homophily_all: Tensor
    heterophily_all: Tensor

    def message(self) -> Message:
        return {
            "homophily_levels": self.homophily_levels, "heterophily_levels": self.heterophily_levels,
            "homophily_all": self.homophily_all, "heterophily_all": self.heterophily_all,
        }  # fmt: skip


def client_subspaces(
    homophily_bases: Tensor, heterophily_bases: Tensor, q: int, generator: torch.Generator
) -> Subspaces:
    """PCA subspaces of u_k and g_k (each [N, F]) and of [u_1 … u_K], [g_1 … g_K] ([N, K·F], level-major)."""

    def per_level(bases: Tensor) -> Tensor:
        return torch.stack([principal_directions(b, q, generator) for b in bases])  # [K, q, F]

    def concatenated(bases: Tensor) -> Tensor:
        return principal_directions(bases.permute(1, 0, 2).reshape(bases.shape[1], -1), q, generator)  # [q, K·F]

    return Subspaces(
        per_level(homophily_bases).float(), per_level(heterophily_bases).float(),
        concatenated(homophily_bases).float(), concatenated(heterophily_bases).float(),
    )  # fmt: skip


class FedICIClient(TrainingClient):
    """Trains its UniFilter from the personalised weights; sends its spectral subspaces in the first rounds."""

    params: FedICIParams
    model: UniFilter

    def __init__(self, cid: int, graph: Data, model: UniFilter, params: FedICIParams, setup: Setup) -> None:
        super().__init__(cid, graph, model, params, setup)
        mlp = [p for name, p in model.named_parameters() if name != FILTER_KEY]
        self.optimizer = torch.optim.Adam([
            {"params": mlp, "lr": params.lr, "weight_decay": params.weight_decay},
            {"params": [model.level_weights], "lr": params.filter_lr, "weight_decay": params.filter_weight_decay},
        ])  # fmt: skip
        _, homophily_bases, heterophily_bases = type(model).components(graph, params)  # 2 × [K, N, F], float64
        generator = torch.Generator().manual_seed(setup.seed * 100_003 + cid)
        self.subspaces = client_subspaces(homophily_bases, heterophily_bases, params.principal_dims, generator)

    def receive(self, rnd: Round, message: Message) -> None:
        load_model_state(self.model, message["weights"])

    def fit(self, rnd: Round, message: Message) -> Message:
        self.receive(rnd, message)
        self.train_local()
        upload: Message = {"weights": model_state(self.model)}
        if rnd.index < self.params.graph_rounds:
            upload["subspaces"] = self.subspaces.message()
        return upload


# ---------------------------------------------------------------------------------------------------
# Server side: client graphs from principal angles, personalised aggregation


def initial_client_graph(num_clients: int) -> Tensor:
    """1/(M−1) between distinct clients, 0 on the diagonal (the official start); [[1]] for one client."""
    if num_clients == 1:
        return torch.ones(1, 1, dtype=torch.float64)
    graph = torch.full((num_clients, num_clients), 1.0 / (num_clients - 1), dtype=torch.float64)
    return graph.fill_diagonal_(0.0)


def dimension_weights(flat: Tensor, graph: Tensor) -> Tensor:
    """r_d = 10⁴ (1/m_d) / Σ_e (1/m_e), m_d = (Pᵀ L P)_dd + 1e-10, L the Laplacian of (W + Wᵀ)/2.

    Dimensions that vary little between neighbouring clients weigh more. flat [M, qD], graph [M, M] → [qD].
    Only the diagonal of PᵀLP is formed (the official code builds the [qD, qD] product).
    """
    symmetric = (graph + graph.T) / 2
    laplacian = torch.diag(symmetric.sum(dim=1)) - symmetric
    smoothness = (flat * (laplacian @ flat)).sum(dim=0) + 1e-10
    inverse = 1.0 / smoothness
    return inverse / inverse.sum() * 1e4


def subspace_cosines(subspaces: Tensor) -> Tensor:
    """cos of the mean principal angle between every two clients' row spaces. [M, q, D] → [M, M].

    Principal angles: σ_l = cos φ_l are the singular values of B_iᵀ B_j with B_i an orthonormal basis of
    client i's row space; a rank below q counts the missing angles as π/2. Symmetric, 1 on the diagonal
    for full-rank subspaces.
    """
    q = subspaces.shape[1]
    _, sigma, vh = torch.linalg.svd(subspaces, full_matrices=False)  # vh [M, q, D]
    rank_ok = sigma > 1e-10 * sigma[:, :1].clamp(min=1e-300)
    basis = vh * rank_ok.unsqueeze(-1)
    overlap = torch.einsum("aqd,brd->abqr", basis, basis)  # [M, M, q, q]
    cosines = torch.linalg.svdvals(overlap).clamp(0.0, 1.0)  # [M, M, min(q, q)]
    angles = torch.arccos(cosines)
    angles = torch.cat([angles, angles.new_full((*angles.shape[:2], q - angles.shape[2]), math.pi / 2)], dim=2)
    cos = torch.cos(angles.mean(dim=2))
    return (cos + cos.T) / 2  # exact symmetry against rounding


def greedy_subspace_cosines(subspaces: Tensor, divisor: float = 3.0) -> Tensor:
    """The official `compute_principal_angles_k`: q times take the largest row-to-row cosine and remove its
    row and column; cos(Σ φ / divisor), divisor hard-coded 3. [M, q, D] → [M, M]."""
    m, q, _ = subspaces.shape
    norms = subspaces.norm(dim=2)  # [M, q]
    dots = torch.einsum("aqd,brd->abqr", subspaces, subspaces)
    cosine = (dots / (norms[:, None, :, None] * norms[None, :, None, :] + 1e-10)).reshape(m, m, q * q)
    rows = torch.arange(q * q) // q
    cols = torch.arange(q * q) % q
    picked = []
    for _ in range(q):
        value, index = cosine.max(dim=2)  # [M, M]
        picked.append(value)
        removed = (rows == (index // q).unsqueeze(-1)) | (cols == (index % q).unsqueeze(-1))  # [M, M, q²]
        cosine = cosine.masked_fill(removed, -math.inf)
    angles = torch.arccos(torch.stack(picked, dim=2).clamp(-1.0, 1.0))
    return torch.cos(angles.sum(dim=2) / divisor)


def affinities(t: Tensor, gamma: float, rule: str = "paper") -> Tensor:
    """h_ij = 1/M − t_ij/(2γ) + Σ_l t_il/(2Mγ): the unconstrained minimiser of Σ_j t_ij w_j + γ‖w‖² on
    Σ_j w_j = 1 (rows sum to 1). `rule="code"`: the official loop fills h_ij = h_ji from row min(i, j)."""
    m = t.shape[0]
    row_sum = t.sum(dim=1)
    if rule == "code":
        first = torch.minimum(torch.arange(m).unsqueeze(1), torch.arange(m).unsqueeze(0))
        return 1.0 / m - t / (2 * gamma) + row_sum[first] / (2 * m * gamma)
    return 1.0 / m - t / (2 * gamma) + row_sum.unsqueeze(1) / (2 * m * gamma)


def simplex_projection(h: Tensor) -> Tensor:
    """Each row's Euclidean projection onto the probability simplex (sort and threshold). [M, M] → [M, M]."""
    m = h.shape[1]
    ordered = h.sort(dim=1, descending=True).values
    excess = ordered.cumsum(dim=1) - 1.0
    ranks = torch.arange(1, m + 1, dtype=h.dtype)
    support = (ordered - excess / ranks > 0).sum(dim=1, keepdim=True)  # ≥ 1
    threshold = excess.gather(1, support - 1) / support
    return (h - threshold).clamp(min=0.0)


def one_newton_threshold(h: Tensor) -> Tensor:
    """The official `Update_W` tail: b_i = one Newton step from 0 on (1/M)Σ_j ReLU(b − h_ij) − b = 0,
    W_i = ReLU(h_i − b_i) (the server's B is reset to 0 every round, so the step always starts at 0)."""
    m = h.shape[1]
    loss = (-h).clamp(min=0).sum(dim=1) / m
    slope = (h < 0).sum(dim=1).to(h.dtype) / m - 1.0
    b = torch.where(slope != 0, -loss / slope.where(slope != 0, torch.ones_like(slope)), torch.zeros_like(loss))
    return (h - b.unsqueeze(1)).clamp(min=0.0)


def learn_client_graph(
    graph: Tensor, homophily: Tensor, heterophily: Tensor, params: FedICIParams
) -> tuple[Tensor, Tensor]:
    """One graph update from the previous graph [M, M] and the clients' subspaces (P, Q each [M, q, D]).

    Returns (W_new [M, M], t [M, M]).
    """
    m = graph.shape[0]
    flat_p, flat_q = homophily.reshape(m, -1).double(), heterophily.reshape(m, -1).double()
    r = dimension_weights(flat_p, graph)
    s = dimension_weights(flat_q, graph)
    if params.graph_rule == "code":
        weighted_p = (r.unsqueeze(1) * flat_p.T).reshape(homophily.shape)  # [qD, M] read as [M, q, D]
        weighted_q = (s.unsqueeze(1) * flat_q.T).reshape(heterophily.shape)
        cos_p, cos_q = greedy_subspace_cosines(weighted_p), greedy_subspace_cosines(weighted_q)
    else:
        weighted_p = (flat_p * r).reshape(homophily.shape)
        weighted_q = (flat_q * s).reshape(heterophily.shape)
        cos_p, cos_q = subspace_cosines(weighted_p), subspace_cosines(weighted_q)
    t = params.alpha * cos_q - params.beta * cos_p
    h = affinities(t, params.gamma, params.graph_rule)
    new = one_newton_threshold(h) if params.graph_rule == "code" else simplex_projection(h)
    return new, t


def personalised_states(
    states: list[dict[str, Tensor]], graph: Tensor, level_graphs: Tensor
) -> list[dict[str, Tensor]]:
    """θ̃_i = Σ_j W_ij θ_j key by key; the filter weights' row 0 by W, row k ≥ 1 by W^(k). Not renormalised."""
    mixed: list[dict[str, Tensor]] = [{} for _ in states]
    for key in states[0]:
        stacked = torch.stack([s[key] for s in states]).to(torch.float64)  # [M, ...]
        if key == FILTER_KEY:
            graphs = torch.cat([graph.unsqueeze(0), level_graphs]).to(stacked.device)  # [K+1, M, M]
            out = torch.einsum("kij,jkf->ikf", graphs, stacked)
        else:
            out = torch.tensordot(graph.to(stacked.device), stacked, dims=1)
        for row, value in enumerate(out.to(states[0][key].dtype)):
            mixed[row][key] = value
    return mixed


class FedICIServer(Server):
    """Holds the overall and per-level client graphs and each client's personalised model."""

    params: FedICIParams

    def __init__(self, model: UniFilter, params: FedICIParams, setup: Setup) -> None:
        super().__init__(model, params, setup)
        m = setup.num_clients
        self.graph = initial_client_graph(m)  # W [M, M]
        self.level_graphs = initial_client_graph(m).expand(params.levels, m, m).clone()  # W^(k) [K, M, M]
        initial = model_state(model)
        self.personalised: dict[int, dict[str, Tensor]] = {cid: initial for cid in range(m)}

    def configure(self, rnd: Round, client_ids: list[int]) -> dict[int, Message]:
        return {cid: {"weights": self.personalised[cid]} for cid in client_ids}

    def aggregate(self, rnd: Round, uploads: Mapping[int, Message]) -> None:
        ids = sorted(uploads)
        if ids != list(range(self.setup.num_clients)):
            raise RuntimeError("FedICI's client graphs need every client's upload in every round")
        if rnd.index < self.params.graph_rounds:
            self.update_graphs([uploads[cid]["subspaces"] for cid in ids])
        mixed = personalised_states([uploads[cid]["weights"] for cid in ids], self.graph, self.level_graphs)
        self.personalised = dict(zip(ids, mixed))

    def update_graphs(self, subspaces: list[Message]) -> None:
        """The official order: the K level graphs, then the overall graph; each from its own previous value."""
        homophily = torch.stack([s["homophily_levels"] for s in subspaces], dim=1).cpu()  # [K, M, q, F]
        heterophily = torch.stack([s["heterophily_levels"] for s in subspaces], dim=1).cpu()
        for k in range(self.params.levels):
            self.level_graphs[k], _ = learn_client_graph(
                self.level_graphs[k], homophily[k], heterophily[k], self.params
            )
        homophily_all = torch.stack([s["homophily_all"] for s in subspaces]).cpu()  # [M, q, K·F]
        heterophily_all = torch.stack([s["heterophily_all"] for s in subspaces]).cpu()
        self.graph, _ = learn_client_graph(self.graph, homophily_all, heterophily_all, self.params)

    def diagnostics(self) -> dict[str, float]:
        """Mean self-weight of the overall and the level graphs (1/M: uniform; 1: no collaboration)."""
        return {
            "self_weight": self.graph.diagonal().mean().item(),
            "level_self_weight": self.level_graphs.diagonal(dim1=1, dim2=2).mean().item(),
        }

    def snapshot(self) -> dict[str, Tensor]:
        return {"graph": self.graph.clone(), "level_graphs": self.level_graphs.clone()}


class FedICI(Method):
    name = "fedici"
    needs_every_client = "its client graph is learned from every client's upload in every round"
    title = "FedICI"
    summary = (
        "UniFilter weights and (first rounds) basis subspaces up; per-client mix by principal-angle client graphs down"
    )
    Params = FedICIParams
    client = FedICIClient
    server = FedICIServer
    # The released code's readings (graph_rule=code, unifilter-code) and FedGSP `core/config.py`'s block of
    # each (dataset, partition, clients), every value with its config line (docs/baselines/fedici.md).
    paper_preset_file = "fedici.csv"
