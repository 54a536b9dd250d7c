"""FedGMC: Federated Graph Manifold Calibration ("Beyond Rigid Alignment", paper §4, App. B.1).

Algorithm, per round (docs/fedgmc.md maps every step to the paper and lists the choices it leaves open):

Server state: semantic anchors Δ (a simplex ETF, Eq. 1-2), Q structural templates T_q ∈ R^{2×d}
(random), and, depending on `share`, averaged model weights.

Client m, given Δ and T:
  1. H2GCN ego embeddings h = σ(x W_ego), σ = tanh by default (`backbone=h2gcn-tanh`; docs/fedgmc.md
     item 18); 1-hop and strict 2-hop aggregations of them.
  2. Semantic calibration (§4.2.2): P_m = class means of h over the labelled nodes; R_m = U Vᵀ from
     the SVD of Δ P_mᵀ over the classes the client holds; loss = mean_v ‖R_m h_v − δ_{y_v}‖² (Eq. 3).
  3. Structural calibration (§4.3.2): B sampled nodes; r¹ = ‖·‖-normalised 1-hop aggregation,
     r² = ‖·‖-normalised COMBINE(1-hop, 2-hop) (Eq. 4-6); μ_b = uniform measure on {r¹_b, r²_b};
     F_m = Sinkhorn assignment of the B measures to the Q templates on the costs W(μ_b, ν_q);
     loss = (1/B) Σ_b Σ_q F_bq W(μ_b, ν_q) (Eq. 7).
  4. Local objective CE + semantic + structural (Eq. 74); upload the calibrated class means
     K_m = R_m P_m, per-class semantic losses, the B radial sequences, F_m, and the shared weights.

Server, given the uploads (§4.4):
  5. Anchors: v_i = mean_m (K_{m,i} − δ_i); γ = softmax(L̄/τ); s_i = −Σ_{j≠i} δ_j/‖δ_i − δ_j‖²;
     step γ_i v_i + s_i clipped to length η; projected back to the unit sphere (Eq. 8).
  6. Templates: F-weighted fused Gromov-Wasserstein barycentre of the uploaded two-point measures
     (Eq. 9 fixes the template's internal distance; the Wasserstein part fixes its coordinates).
  7. Weights: training-size-weighted mean of what the clients share (`share`).

Shapes in code: embeddings are rows, so the anchors are stored as Δᵀ ∈ R^{C×d} (row i = δ_i) and a
row embedding h is calibrated as h R_mᵀ (R_m acts on column vectors, as in the paper's Procrustes
problem; the paper's Eq. 3 writes h R_m, which mixes the two conventions).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F
from torch_geometric.data import Data

from gflbench.backbones import BACKBONES, FEDGMC_BACKBONE, H2GCN, H2GCNRepresentations, backbone_class
from gflbench.core.aggregation import load_model_state, model_state, weighted_mean
from gflbench.core.method import (
    SHARED_SEARCH_SPACE,
    Message,
    Method,
    MethodParams,
    Round,
    Server,
    Setup,
    at_least,
    int_range,
    log_range,
    non_negative,
    positive,
)
from gflbench.core.switches import fidelity_switch
from gflbench.core.training import TrainingClient
from gflbench.errors import UserError
from gflbench.methods.fedgmc_sinkhorn import sinkhorn_assignment, sinkhorn_assignments

SHARES = ("all", "backbone", "none")
COMBINES = ("sum", "ring")


@dataclass(frozen=True)
class FedGMCParams(MethodParams):
    """FedGMC's hyperparameters. Q, B, tau, eta are the four of the paper's sensitivity study (Fig. 4,
    8, 9), whose values the text does not give; the defaults are ours (docs/fedgmc.md)."""

    search_space = {
        **SHARED_SEARCH_SPACE,  # H2GCN is part of the method
        "semantic_weight": log_range(0.01, 50.0),  # Eq. 74's weights: the paper gives no value
        "structural_weight": log_range(0.01, 50.0),
        "Q": int_range(2, 20),  # the paper's sensitivity range (Fig. 4)
    }

    bounds = {
        "Q": at_least(1), "B": at_least(1), "tau": positive(), "eta": positive(), "sinkhorn_reg": positive(),
        "sinkhorn_marginal": non_negative(), "semantic_weight": non_negative(), "structural_weight": non_negative(),
    }  # fmt: skip

    backbone: str = FEDGMC_BACKBONE  # H2GCN (paper B.6) with σ = tanh for the ego embeddings (docs/fedgmc.md, item 18)
    # weights averaged besides the manifolds; the paper does not say (docs/fedgmc.md, item 16)
    share: str = fidelity_switch("backbone", "all / backbone (head local) / none")
    lr: float = 0.05  # chosen by validation over {0.01, 0.05} (docs/fedgmc.md)
    Q: int = 10  # global structural templates
    B: int = 64  # nodes sampled per client and round for its local structural manifold
    tau: float = 1.0  # temperature of the anchors' difficulty weights γ = softmax(L̄ / tau)
    eta: float = 0.1  # largest step of one anchor per refinement
    sinkhorn_reg: float = 0.1  # entropic regularisation of the Sinkhorn assignment F (not given in the paper)
    sinkhorn_relative: bool = fidelity_switch(True, "True: sinkhorn_reg relative to the costs' spread; False: absolute")
    sinkhorn_marginal: float = 0.0  # KL weight on the marginals: 0 = balanced Sinkhorn, > 0 = unbalanced (POT)
    # project refined template rows back onto the unit sphere
    renormalize_templates: bool = fidelity_switch(False, "False: Eq. 9's barycentre as written; True: projected")
    combine: str = fidelity_switch("sum", "r² of Eq. 5 — sum: 1-hop + 2-hop aggregations; ring: the strict 2-hop alone")
    semantic_weight: float = 1.0  # weight of Eq. 3 in Eq. 74
    structural_weight: float = 1.0  # weight of Eq. 7 in Eq. 74
    semantic: bool = True  # semantic manifold calibration (off: Table 6 "w/o Semantic")
    structural: bool = True  # structural manifold calibration (off: "w/o Structural")
    refine: bool = True  # server-side manifold refinement (off: "w/o Refinement")

    def __post_init__(self) -> None:
        if not issubclass(backbone_class(self.backbone), H2GCN):
            h2gcns = ", ".join(name for name, cls in BACKBONES.items() if issubclass(cls, H2GCN))
            raise UserError(
                f"FedGMC calibrates H2GCN's ego and hop embeddings: backbone must be one of {h2gcns}, not {self.backbone!r}"
            )
        if self.share not in SHARES:
            raise UserError(f"share must be one of {', '.join(SHARES)}, got {self.share!r}")
        if self.combine not in COMBINES:
            raise UserError(f"combine must be one of {', '.join(COMBINES)}, got {self.combine!r}")
        for name in ("Q", "B"):
            if getattr(self, name) < 1:
                raise UserError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("tau", "eta", "sinkhorn_reg"):
            if getattr(self, name) <= 0:
                raise UserError(f"{name} must be positive, got {getattr(self, name)}")


# ----------------------------------------------------------------------------- global manifolds


def simplex_etf(dim: int, num_classes: int, generator: torch.Generator) -> Tensor:
    """Anchors Δᵀ ∈ R^{C×d} of a simplex ETF (Eq. 2): unit norm, pairwise cosine −1/(C−1) (Eq. 1).

    Eq. 2 only applies Φ to vectors summing to zero, so Φ needs to be an isometry on that (C−1)-
    dimensional subspace, not on all of R^C: Φ = O Eᵀ with E an orthonormal basis of {x: Σx = 0} and
    O ∈ R^{d×(C−1)} random with orthonormal columns. That exists whenever d ≥ C−1 (a Φ with C
    orthonormal columns would need d ≥ C) and gives the same family of frames.
    """
    if num_classes < 2:
        raise UserError(f"FedGMC's simplex ETF needs at least 2 classes, got {num_classes}")
    if dim < num_classes - 1:
        raise UserError(
            f"a simplex ETF of {num_classes} anchors needs embedding dimension d >= C-1 = {num_classes - 1}; "
            f"hidden is {dim} (set fedgmc.hidden)"
        )
    centering = torch.eye(num_classes, dtype=torch.float64) - 1.0 / num_classes
    basis, _ = torch.linalg.qr(centering[:, : num_classes - 1])  # [C, C-1], orthonormal, ⟂ 1
    gaussian = torch.randn(dim, num_classes - 1, generator=generator, dtype=torch.float64)
    rotation, _ = torch.linalg.qr(gaussian)  # [d, C-1], orthonormal columns
    delta = math.sqrt(num_classes / (num_classes - 1)) * rotation @ basis.T @ centering
    return delta.T.float().contiguous()


def random_templates(num_templates: int, dim: int, generator: torch.Generator) -> Tensor:
    """Q initial templates ∈ R^{Q×2×d} (§4.3.1: "initialized randomly"), rows on the unit sphere,
    where the ℓ2-normalised radial sequences they are compared with live."""
    return F.normalize(torch.randn(num_templates, 2, dim, generator=generator), dim=-1)


def equiangular_deviation(anchors: Tensor) -> Tensor:
    """max_{i≠j} |cos(δ_i, δ_j) + 1/(C−1)|: zero for a simplex ETF; grows as refinement bends it."""
    unit = F.normalize(anchors, dim=1)
    num_classes = anchors.shape[0]
    cosines = unit @ unit.T
    diagonal = torch.eye(num_classes, dtype=torch.bool, device=anchors.device)
    # zeros on the diagonal leave the maximum of the non-negative off-diagonal values as it is, and
    # unlike selecting the off-diagonal entries, need no count read back from a GPU
    return (cosines + 1.0 / (num_classes - 1)).abs().masked_fill(diagonal, 0.0).max()


# ----------------------------------------------------------------------------- semantic calibration


def procrustes(means: Tensor, anchors: Tensor, present: Tensor) -> tuple[Tensor, Tensor]:
    """The part of R = argmin_{RᵀR=I} ‖R P_S − Δ_S‖_F that FedGMC uses, over the present classes S.

    `means` and `anchors` hold p_c and δ_c as rows; a class the client lacks has no mean and is left
    out of the fit (its row is masked), so it neither attracts nor repels the rotation.

    The paper's solution is R = U Vᵀ from the SVD Δ_S P_Sᵀ = U Σ Vᵀ. That matrix has rank k ≤ C, far
    below d, so R is fixed on k dimensions and free (any isometry) on the rest, and everything FedGMC
    computes with it (R p_c, Rᵀ δ_c, and ‖R h − δ‖² = ‖h‖² + ‖δ‖² − 2⟨h, Rᵀδ⟩) depends on the fixed part
    only. We return its thin factors (U_k, V_k) ∈ R^{d×k}, with R = U_k V_kᵀ + (isometry between the
    complements), from QR factors of Δ_S and P_S and a k×k SVD: the same optimum as a d×d SVD at a
    tenth of its cost (tests/test_fedgmc.py completes R and checks Lemmas A.5-A.6 on it).

    Leading dimensions batch: [M, C, d] inputs solve M clients' problems in one call of each
    factorisation (the batched path's `group_step`: on a GPU one batched solver launch instead
    of three per client and step); a single [C, d] problem runs the same operations as before.
    """
    left_basis, left_r = torch.linalg.qr((anchors * present[..., None]).mT)  # Δ_S = Qa Ra, [d, C], [C, C]
    right_basis, right_r = torch.linalg.qr((means * present[..., None]).mT)  # P_S = Qb Rb
    u, _, vh = torch.linalg.svd(left_r @ right_r.mT)  # Δ_S P_Sᵀ = Qa (Ra Rbᵀ) Qbᵀ
    return left_basis @ u, right_basis @ vh.mT


def class_means(embeddings: Tensor, labels: Tensor, counts: Tensor) -> Tensor:
    """Per-class mean rows [C, d] given the class counts [C] (`torch.bincount(labels, minlength=C)`).

    The counts are an argument because a client's labelled nodes never change: it counts them once
    (a bincount reads the labels' maximum back from a GPU), so no local step waits for the host.
    """
    sums = torch.zeros(len(counts), embeddings.shape[1], dtype=embeddings.dtype, device=embeddings.device)
    sums.index_add_(0, labels, embeddings)
    return sums / counts.clamp(min=1)[:, None]


# ----------------------------------------------------------------------------- structural calibration


def radial_sequences(reps: H2GCNRepresentations, nodes: Tensor, combine: str) -> Tensor:
    """[r¹ | r²] ∈ R^{B×2×d} of the sampled nodes (Eq. 4-6).

    r¹ normalises the 1-hop aggregation of ego embeddings. Eq. 5 COMBINEs the 1-hop and 2-hop
    aggregations into one d-vector (r² must match r¹'s dimension to form the 2×d matrix): "sum" adds
    them (their mean, up to the normalisation that follows); "ring" keeps the strict 2-hop ring alone.
    """
    hop1 = reps.hop1[nodes]
    hop2 = reps.hop2[nodes]
    second = hop1 + hop2 if combine == "sum" else hop2
    return F.normalize(torch.stack([hop1, second], dim=1), dim=-1)


def two_point_wasserstein(measures: Tensor, templates: Tensor) -> Tensor:
    """W(μ_b, ν_q) ∈ R^{B×Q} for uniform two-point measures, squared Euclidean ground cost (W₂²).

    Between two uniform measures on two points each, an optimal plan is a permutation (Birkhoff), so
    W = ½ min(c(a₁,b₁) + c(a₂,b₂), c(a₁,b₂) + c(a₂,b₁)). Both matchings pay the same squared norms, and
    their cross terms differ by the sign of (a₁ − a₂)·(b₁ − b₂), so
    W = ½ (‖a₁‖² + ‖a₂‖² + ‖b₁‖² + ‖b₂‖² − (a₁ + a₂)·(b₁ + b₂) − |(a₁ − a₂)·(b₁ − b₂)|):
    two small matrix products instead of B·Q LP solves; it equals POT's exact `ot.emd2`
    (tests/test_fedgmc.py).
    """
    norms = (measures**2).sum((1, 2))[:, None] + (templates**2).sum((1, 2))[None, :]
    common = measures.sum(1) @ templates.sum(1).T
    matching = (measures[:, 0] - measures[:, 1]) @ (templates[:, 0] - templates[:, 1]).T
    return 0.5 * (norms - common - matching.abs())


# ----------------------------------------------------------------------------- server refinement


def refine_anchors(
    anchors: Tensor,
    calibrated: Tensor,
    present: Tensor,
    class_loss: Tensor,
    tau: float,
    eta: float,
    eps: float = 1e-8,
) -> Tensor:
    """One dynamic refinement of the semantic anchors (§4.4.1, Eq. 8).

    anchors [C, d]; calibrated [M, C, d] = K_{m,i}; present [M, C]; class_loss [M, C] = client m's mean
    semantic loss over its nodes of class i. Averages run over the clients that hold class i (the paper's
    1/M assumes every client holds every class); a class nobody holds gets γ_i = 0 and v_i = 0, so only
    the repulsion moves it. The clipped step has length ≤ η; the projection cannot lengthen it when it
    ends outside the unit ball (the usual case: s_i points outwards), and by at most a factor
    1 + O(η²) when it ends inside.
    """
    weight = present.to(anchors.dtype)
    holders = weight.sum(0)  # [C]
    deviation = ((calibrated - anchors[None]) * weight[..., None]).sum(0) / holders.clamp(min=1)[:, None]
    mean_loss = (class_loss * weight).sum(0) / holders.clamp(min=1)
    gamma = torch.softmax((mean_loss / tau).masked_fill(holders == 0, -math.inf), dim=0).nan_to_num(0.0)
    sq_dist = torch.cdist(anchors, anchors).pow(2).fill_diagonal_(math.inf)
    repulsion = -(anchors[None, :, :] / sq_dist[:, :, None]).sum(1)  # s_i = −Σ_{j≠i} δ_j / ‖δ_i − δ_j‖²
    step = gamma[:, None] * deviation + repulsion  # δ̃_i − δ_i
    scale = torch.clamp(eta / (step.norm(dim=1, keepdim=True) + eps), max=1.0)  # t_i
    return F.normalize(anchors + scale * step, dim=1)


def refine_templates(
    templates: Tensor, measures: Tensor, assignment: Tensor, max_iter: int = 100
) -> tuple[Tensor, Tensor]:
    """F-weighted fused Gromov-Wasserstein barycentres of two-point measures, one per template (Eq. 9).

    templates [Q, 2, d] (the warm start); measures [S, 2, d], the uploaded radial sequences of all
    clients; assignment [S, Q], their F rows. For template q the weights are λ_sq = F_sq / Σ_s F_sq.

    Eq. 9's GW barycentre fixes only the template's internal distance (GW is invariant to isometries).
    We solve the fused problem (POT `ot.gromov.fgw_barycenters` with a fixed two-point support), whose
    feature part gives coordinates. For two-point measures its block-coordinate iterations are exact
    and cheap: the GW term is the same for both matchings of the two points, so each input's plan is
    the matching with the lower feature cost, for any trade-off α < 1; the coordinates are then the
    λ-weighted mean of the matched points, and the structure is the λ-weighted mean of the inputs'
    distances (Eq. 9's minimiser). Iterating until no matching changes reproduces POT's result
    (tests/test_fedgmc.py) without Q·S small LP solves per iteration.

    Returns the refined templates [Q, 2, d] and the internal distance of each GW barycentre [Q].
    """
    mass = assignment.sum(0)  # [Q]
    weights = assignment / mass.clamp(min=torch.finfo(assignment.dtype).tiny)
    flipped = measures.flip(1)
    spread = measures[:, 0] - measures[:, 1]  # [S, d]
    current = templates
    previous: Tensor | None = None
    for _ in range(max_iter):
        swap = spread @ (current[:, 0] - current[:, 1]).T < 0  # the crossed matching is cheaper, [S, Q]
        if previous is not None and torch.equal(swap, previous):
            break
        current = torch.einsum("sq,skd->qkd", weights * ~swap, measures) + torch.einsum(
            "sq,skd->qkd", weights * swap, flipped
        )
        previous = swap
    refined = torch.where(mass[:, None, None] > 0, current, templates)
    distances = weights.T @ spread.norm(dim=1)
    return refined, distances


# ----------------------------------------------------------------------------- parties


class FedGMCClient(TrainingClient):
    """Trains H2GCN on CE + semantic + structural calibration; uploads its local manifolds."""

    params: FedGMCParams

    def __init__(self, cid: int, graph: Data, model: H2GCN, params: FedGMCParams, setup: Setup) -> None:
        super().__init__(cid, graph, model, params, setup)
        self.train_labels = graph.y[self.train_index]
        # The labelled nodes never change: their class counts are read once, not at every step.
        self.class_counts = torch.bincount(self.train_labels, minlength=setup.num_classes)
        self.present = self.class_counts > 0
        # Structural sampling draws from nodes with a neighbour: an isolated node has no 1-hop ring.
        self.candidates = (graph.hop1_adj.crow_indices().diff() > 0).nonzero().view(-1)
        self.num_candidates = int(self.candidates.numel())
        # Seeded by (run seed, client id), so the run is deterministic and clients draw independently.
        seed = np.random.SeedSequence([setup.seed, cid]).generate_state(1)[0]
        self.generator = torch.Generator().manual_seed(int(seed))
        self.anchors = torch.empty(0)
        self.templates = torch.empty(0)
        self.order = torch.empty(0, dtype=torch.long)
        self.sample: Tensor | None = None
        self.assignment: Tensor | None = None
        self.rotation: tuple[Tensor, Tensor, Tensor] | None = None  # this step's (P_m, U_k, V_k), solved together
        self.state: dict[str, Tensor] = {}

    def receive(self, rnd: Round, message: Message) -> None:
        if "weights" in message:
            load_model_state(self.model, message["weights"])
        self.anchors = message["anchors"]
        self.templates = message["templates"]
        self.order = self.draw_order()
        self.sample = (
            None  # placed on the device at first use (`sampled_nodes`), by the batched path for all clients at once
        )
        self.assignment = None  # solved at the round's first step, kept for its later epochs

    def draw_order(self) -> Tensor:
        """Positions of B candidates without replacement, on the host: one draw per round from this
        client's own seeded generator (a CPU generator, so every device samples the same nodes)."""
        return torch.randperm(self.num_candidates, generator=self.generator)[: self.params.B]

    def sampled_nodes(self) -> Tensor:
        """This round's B nodes on the graph's device; the copy of the drawn order is made once."""
        if self.sample is None:
            self.sample = self.candidates[self.order.to(self.candidates.device)]
        return self.sample

    def objective(self, logits: Tensor, reps: H2GCNRepresentations) -> Tensor:
        """CE + semantic + structural calibration; the detached parts the upload needs are kept in `self.state`.

        R_m (closed form) and F_m (Sinkhorn) are solved for the current embeddings and held fixed in the
        gradient step, an alternating scheme: SVD gradients are undefined at the repeated zero singular
        values that Δ P_mᵀ (rank ≤ C < d) always has, and Eq. 7 weighs W by F as a given plan.
        """
        p = self.params
        ce = F.cross_entropy(logits[self.train_index], self.train_labels)
        total = ce
        losses = [ce.detach()]
        if p.semantic:
            semantic = self.semantic_loss(reps.ego[self.train_index])
            total = total + p.semantic_weight * semantic
            losses.append(semantic.detach())
        if p.structural:
            structural = self.structural_loss(reps)
            total = total + p.structural_weight * structural
            losses.append(structural.detach())
        self.state["losses"] = torch.stack(losses)
        return total

    def semantic_loss(self, ego: Tensor) -> Tensor:
        """Eq. 3 over the client's labelled nodes, averaged (the paper's sum would scale with the
        client's label count and swamp the CE at weight 1); per-class parts are kept for γ."""
        num_classes = self.setup.num_classes
        if self.rotation is None:  # the per-client path; the batched one solved it in `group_step`
            means = class_means(ego.detach(), self.train_labels, self.class_counts)
            left, right = procrustes(means, self.anchors, self.present)
        else:
            means, left, right = self.rotation
            self.rotation = None  # this step's: the next step's embeddings differ
        pulled_back = self.anchors @ left @ right.T  # row c = R_mᵀ δ_c
        # ‖R_m h − δ_y‖² = ‖h‖² + ‖δ_y‖² − 2⟨h, R_mᵀ δ_y⟩, as R_m is orthogonal
        labels = self.train_labels
        cross = (ego * pulled_back[labels]).sum(1)
        per_node = (ego**2).sum(1) + (self.anchors[labels] ** 2).sum(1) - 2 * cross
        class_loss = per_node.new_zeros(num_classes).index_add_(0, labels, per_node.detach())
        self.state["calibrated"] = means @ right @ left.T  # K_m: row c = R_m p_c
        self.state["present"] = self.present
        self.state["class_loss"] = class_loss / self.class_counts.clamp(min=1)
        return per_node.mean()

    def structural_loss(self, reps: H2GCNRepresentations) -> Tensor:
        """Eq. 7 for this client: (1/B) Σ_b Σ_q F_bq W(μ_b, ν_q), differentiable in the embeddings."""
        p = self.params
        measures = radial_sequences(reps, self.sampled_nodes(), p.combine)
        costs = two_point_wasserstein(measures, self.templates)
        if len(costs) == 0:  # no node with a neighbour: nothing to calibrate
            self.assignment = costs.detach()
        elif self.assignment is None:
            self.assignment = sinkhorn_assignment(costs, p.sinkhorn_reg, p.sinkhorn_relative, p.sinkhorn_marginal)
        self.state["measures"] = measures.detach()
        self.state["assignment"] = self.assignment
        return (self.assignment * costs).sum(1).mean() if len(costs) else costs.sum()

    @classmethod
    def group_step(cls, clients: Sequence[TrainingClient], representations: Sequence[Any]) -> None:
        """What the batched path solves for these clients at once before each local step, so that no
        client's objective makes its own solver calls or host round trips:

        - this round's sampled nodes of every client, placed on the device in one copy;
        - this step's Procrustes factors (`procrustes` on the stacked class means: one batched QR, QR
          and SVD instead of three factorisations per client), which `semantic_loss` then uses;
        - at the round's first step, the balanced Sinkhorn plans F_m (`sinkhorn_assignments`, one
          batched solve and one transfer to the host per sample size B), which `structural_loss` then
          finds solved. The unbalanced solver has no batched form in POT: those clients solve their own.
        """
        ours = list(zip(cast("Sequence[FedGMCClient]", clients), representations))
        unplaced = [c for c, _ in ours if c.params.structural and c.sample is None]
        if unplaced:
            orders = torch.cat([c.order for c in unplaced]).to(unplaced[0].candidates.device)
            for client, order in zip(unplaced, orders.split([len(c.order) for c in unplaced])):
                client.sample = client.candidates[order]
        semantic = [(c, reps) for c, reps in ours if c.params.semantic and c.num_train > 0]
        if len(semantic) >= 2:
            with torch.no_grad():
                means = torch.stack(
                    [class_means(reps.ego[c.train_index], c.train_labels, c.class_counts) for c, reps in semantic]
                )
                anchors = torch.stack([c.anchors for c, _ in semantic])
                lefts, rights = procrustes(means, anchors, torch.stack([c.present for c, _ in semantic]))
            for (client, _), solved in zip(semantic, zip(means.unbind(0), lefts.unbind(0), rights.unbind(0))):
                client.rotation = solved
        pending = [(c, reps) for c, reps in ours
                   if c.params.structural and c.params.sinkhorn_marginal == 0 and c.assignment is None
                   and c.order.numel() > 0]  # fmt: skip
        if len(pending) < 2:
            return
        by_size: dict[int, list[tuple[FedGMCClient, Tensor]]] = {}
        with torch.no_grad():
            for client, reps in pending:
                costs = two_point_wasserstein(
                    radial_sequences(reps, client.sampled_nodes(), client.params.combine), client.templates
                )
                by_size.setdefault(len(costs), []).append((client, costs))
        for group in by_size.values():
            p = group[0][0].params
            plans = sinkhorn_assignments(
                torch.stack([costs for _, costs in group]), p.sinkhorn_reg, p.sinkhorn_relative
            )
            for (client, _), plan in zip(group, plans.unbind(0)):
                client.assignment = plan

    def shared_state(self) -> dict[str, Tensor]:
        """The weights this client uploads under `share` ("none" uploads none)."""
        head = self.model.head if self.params.share == "backbone" else None
        return model_state(self.model, exclude_prefix=head)

    def upload(self) -> Message:
        """Local manifolds of the last local step, its losses, and the shared weights.

        A client without labelled nodes trains nothing; it sends zero-weight manifolds so that it takes
        no part in the refinement (and, as in FedAvg, a weight of one in the weight mean).
        """
        p, d, num_classes = self.params, self.params.hidden, self.setup.num_classes
        device = self.train_index.device
        message: Message = {"num_train": torch.tensor(self.num_train)}
        if p.share != "none":
            message["weights"] = self.shared_state()
        if self.num_train == 0:
            message["losses"] = torch.full((1 + p.semantic + p.structural,), math.nan, device=device)
            if p.semantic:
                message["calibrated"] = torch.zeros(num_classes, d, device=device)
                message["present"] = torch.zeros(num_classes, dtype=torch.bool, device=device)
                message["class_loss"] = torch.zeros(num_classes, device=device)
            if p.structural:
                message["measures"] = torch.zeros(0, 2, d, device=device)
                message["assignment"] = torch.zeros(0, p.Q, device=device)
            return message
        message.update(self.state)
        return message


class FedGMCServer(Server):
    """Holds the anchors, the templates and (by `share`) the averaged weights; refines the manifolds."""

    params: FedGMCParams

    def __init__(self, model: H2GCN, params: FedGMCParams, setup: Setup) -> None:
        super().__init__(model, params, setup)
        generator = torch.Generator().manual_seed(setup.seed)
        self.anchors = simplex_etf(params.hidden, setup.num_classes, generator).to(setup.device)
        self.templates = random_templates(params.Q, params.hidden, generator).to(setup.device)
        self.template_distances = (self.templates[:, 0] - self.templates[:, 1]).norm(dim=1)
        head = model.head if params.share == "backbone" else None
        self.global_weights = model_state(model, exclude_prefix=head) if params.share != "none" else {}
        self.uploads: dict[int, Message] = {}

    def configure(self, rnd: Round, client_ids: list[int]) -> dict[int, Message]:
        message: Message = {"anchors": self.anchors, "templates": self.templates}
        if self.params.share != "none":
            message["weights"] = self.global_weights
        return {cid: message for cid in client_ids}

    def aggregate(self, rnd: Round, uploads: Mapping[int, Message]) -> None:
        p = self.params
        self.uploads = dict(uploads)
        ups = list(uploads.values())
        if p.share != "none":
            sizes = torch.stack([u["num_train"] for u in ups]).float().clamp(min=1)
            self.global_weights = weighted_mean([u["weights"] for u in ups], sizes)
        if not p.refine:
            return
        if p.semantic:
            self.anchors = refine_anchors(
                self.anchors,
                torch.stack([u["calibrated"] for u in ups]),
                torch.stack([u["present"] for u in ups]),
                torch.stack([u["class_loss"] for u in ups]),
                p.tau,
                p.eta,
            )
        if p.structural:
            measures = torch.cat([u["measures"] for u in ups])
            assignment = torch.cat([u["assignment"] for u in ups])
            self.templates, self.template_distances = refine_templates(self.templates, measures, assignment)
            if p.renormalize_templates:  # rows back on the sphere the normalised radial sequences live on
                self.templates = F.normalize(self.templates, dim=2)

    def diagnostics(self) -> dict[str, float]:
        """Per round: the anchors' distance from a simplex ETF and the clients' mean losses."""
        losses = torch.stack([u["losses"] for u in self.uploads.values()]).nanmean(0)
        p = self.params
        names = ["ce_loss"] + ["semantic_loss"] * p.semantic + ["structural_loss"] * p.structural
        values = torch.cat([equiangular_deviation(self.anchors)[None], losses]).tolist()  # one read from the device
        return dict(zip(["equiangular_deviation", *names], values))

    def snapshot(self) -> dict[str, Any]:
        """The global manifolds after this round's refinement and the local manifolds that produced
        them, for the case-study figures (paper Fig. 5, 10-15)."""
        snap: dict[str, Any] = {
            "anchors": self.anchors.cpu(),
            "templates": self.templates.cpu(),
            "template_distances": self.template_distances.cpu(),
        }
        ups = list(self.uploads.values())
        if self.params.semantic and ups:
            snap["calibrated_means"] = torch.stack([u["calibrated"] for u in ups]).cpu()
            snap["class_present"] = torch.stack([u["present"] for u in ups]).cpu()
        if self.params.structural and ups:
            snap["local_structural"] = [u["measures"].cpu() for u in ups]
            snap["assignment"] = [u["assignment"].cpu() for u in ups]
        return snap


# ----------------------------------------------------------------------------- registration


class FedGMC(Method):
    name = "fedgmc"
    title = "FedGMC"
    summary = "semantic anchors, structural templates and local manifolds; weights by `share`"
    Params = FedGMCParams
    client = FedGMCClient
    server = FedGMCServer

    @classmethod
    def without(cls, switch: str, part: str, summary: str) -> type[FedGMC]:
        """The paper's "w/o `part`" ablation (Table 6): FedGMC registered as `fedgmc-wo-<part>`, `switch` off by
        default. Only that default differs, and a run key is the method name and the resolved fields, so the
        ablation keeps its keys. Bind it to `FedGMCWithout<part>` here: its Params pickle (to workers) by that name."""
        params = dataclasses.make_dataclass("Params", [(switch, bool, False)], bases=(cls.Params,), frozen=True)
        name = f"FedGMCWithout{part}"
        params.__module__, params.__qualname__ = cls.__module__, f"{name}.Params"
        title, summary = f"FedGMC (w/o {part})", f"FedGMC {summary} (Table 6)"
        attributes = {"__module__": cls.__module__, "name": f"fedgmc-wo-{part.lower()}", "title": title,
                      "summary": summary, "Params": params}  # fmt: skip
        return cast("type[FedGMC]", type(name, (cls,), attributes))


FedGMCWithoutSemantic = FedGMC.without("semantic", "Semantic", "without semantic manifold calibration")
FedGMCWithoutStructural = FedGMC.without("structural", "Structural", "without structural manifold calibration")
FedGMCWithoutRefinement = FedGMC.without(
    "refine", "Refinement", "with the global manifolds fixed at their initial values"
)
