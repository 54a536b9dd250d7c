"""FedTAD (Zhu et al., IJCAI 2024): topology-aware data-free distillation of the client models into the global one.

Paper: "FedTAD: Topology-aware Data-free Knowledge Distillation for Subgraph Federated Learning",
arXiv 2404.14061. Official code `zyl24/FedTAD` (`train_fedtad.py`, `model.py`, `util/task_util.py`);
OpenFGL's port `openfgl/flcore/fedtad/{client,server,generator,_utils,fedtad_config}.py`.
Rows are nodes throughout: M clients, C classes, d features, n = `num_gen` pseudo nodes, k = `walk_length`.

  Client i, once (before training): class-wise knowledge reliability (CKR) from topology embeddings.
    t_v = [T_vv, (T²)_vv, ..., (T^k)_vv],  T = (A+I)D⁻¹  (random-walk landing probabilities)   [N, k]
    h_v = [x_v ∥ t_v];  r_v = (1 + Σ_{u∈N(v)} cos(h_v, h_u)) / (|N(v)| + 1)
    ckr_i[c] = Σ_{v train, y_v = c} r_v                                                        [C]
  Client i, every round: load the global weights θ, train `local_epochs` CE steps, upload θ_i,
    |V_i| and ckr_i.
  Server, given the uploads (`aggregate` = `average`, then `distill`):
    average: θ ← Σ_i |V_i| θ_i / Σ_i |V_i|  (the official node-count weights).
    distill: ĉ[i, c] = ckr_i[c] / Σ_j ckr_j[c] (each class's reliability shared out over clients);
      pseudo labels y: n / C per class (the rest to the last class). Per node weights
      w[i, v] = ĉ[i, y_v] / n_{y_v}, so Σ_v w[i, v] ℓ_v = Σ_c ĉ[i, c] mean_{v: y_v = c} ℓ_v.
      `glb_epochs` times: z ~ N(0, I) [n, noise_dim];
        X̃ = G(z, y)  (label embedding ∥ z → 64 → 128 → 256 (tanh) → d)               [n, d]
        pseudo graph: each node to its top-k cosine neighbours in X̃, symmetrised; f(·) reads it
          through the backbone's own operators (GCN: D^-1/2 (A+I) D^-1/2).
        generator, `it_g` steps (client models f_i frozen, global f in eval mode):
          L_G = λ1 Σ_i Σ_v w[i,v] CE(f_i(X̃)_v, y_v) − Σ_i Σ_v w[i,v] mean|f(X̃)_v − f_i(X̃)_v|
                + λ2 · M · exp(−mean_{a,b} [‖z_a − z_b‖²/noise_dim] · [‖X̃_a − X̃_b‖₁/d])
        global model, `it_d` steps on the fixed pseudo graph:
          L_D = Σ_i Σ_v w[i,v] mean|f(X̃)_v − f_i(X̃)_v|   (the L1 logit gap, `raw_distill`)
    The distilled θ is broadcast.

Choices and differences from the official code (docs/baselines/fedtad.md):
- Topology embedding (`topology`). The official `cal_topo_emb` builds T = A * pinverse(D), an
  element-wise product where the matrix product A·D⁻¹ is meant: only the diagonal 1/d_v survives,
  and a softmax over each row of T then makes every "walk" step almost uniform over all N nodes; the
  embedding is the list of sampled node ids (walks of lengths 1..k, k(k+1)/2 columns).
  `landing` (default, our reading of the paper, whose method section we could not read here): the
  landing probabilities above, deterministic.
  `walk`: the official sampling with the matrix product and without the softmax, i.e. the node ids
  of walks on D⁻¹(A+I).
  `code`: the official code's behaviour (near-uniform jumps, node ids).
- CKR normalisation (`ckr_norm`): `clients` (official, over clients per class); `classes` is
  OpenFGL's (over classes within each client).
- The generator is run once per step, not once per client: its dropout is 0, so the official M
  forward passes are identical; the diversity term, added once per client there, is weighted by M.
- Teacher logits on the distillation graph are computed once per epoch (the teachers are frozen and
  in eval mode; OpenFGL recomputes identical values `it_d` × M times) and the global model runs once
  per step (OpenFGL: once per client, each with its own dropout mask; the loss is the same sum).
- Dropout follows the module's mode; the official GCN calls F.dropout with its default
  training=True, so dropout also acts on frozen teachers and at evaluation there.
- Backbone: the repository's 2-layer GCN + classifier (paper B.6), not the official GCN without a
  classifier. Training values: the Params defaults are the shared protocol values (hidden 128, weight
  decay 1e-6, one local epoch); the `paper` protocol runs the official ones (hidden 64, lr 0.01, weight
  decay 5e-4, dropout 0.5, 3 local epochs, 100 rounds; gfl_bench/experiments/presets/fedtad.csv).
- Evaluation as every method here (protocol): each client's model right after local training; the
  official code evaluates the broadcast global model, node-count weighted.
- Seeds: noise, generator initialisation and walk sampling come from Setup.seed (and the client id);
  the official code draws from torch's global RNG, seeded once with 2024.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch_geometric.data import Data
from torch_geometric.utils import coalesce, to_scipy_sparse_matrix

from gflbench.backbones import Backbone, backbone_class, build_backbone
from gflbench.baselines.fedavg import FedAvgClient, FedAvgParams, FedAvgServer
from gflbench.core.aggregation import client_weights, load_model_state, model_state, weighted_mean
from gflbench.core.method import (
    BACKBONE_SEARCH_SPACE,
    SHARED_SEARCH_SPACE,
    Message,
    Method,
    Round,
    Setup,
    at_least,
    log_range,
    non_negative,
    positive,
    unit_interval,
)
from gflbench.errors import UserError

TOPOLOGIES = ("landing", "walk", "code")
CKR_NORMS = ("clients", "classes")
FEDTAD_WEIGHTINGS = ("nodes", "train", "uniform")
GENERATOR_WIDTHS = (64, 128, 256)  # official FedTAD_ConGenerator hidden layers


@dataclass(frozen=True)
class FedTADParams(FedAvgParams):
    """FedTAD's hyperparameters; the backbone's training defaults are the shared ones (the `paper` protocol's
    are the official code's, presets/fedtad.csv)."""

    search_space = {
        **SHARED_SEARCH_SPACE, **BACKBONE_SEARCH_SPACE,
        "lam1": log_range(0.1, 10.0),  # λ1 around the official 1 (ours: one decade each way)
        "lam2": log_range(0.1, 10.0),  # λ2 likewise
        "distill_lr": log_range(1e-4, 1e-2),  # around the official 1e-3
    }  # fmt: skip

    bounds = {
        "walk_length": at_least(1), "num_gen": at_least(1), "noise_dim": at_least(1), "topk": at_least(1),
        "glb_epochs": non_negative(), "it_g": non_negative(), "it_d": non_negative(), "gen_lr": positive(),
        "distill_lr": positive(), "server_weight_decay": non_negative(), "lam1": non_negative(), "lam2": non_negative(),
        "gen_dropout": unit_interval(high_open=True),
    }  # fmt: skip

    backbone: str = "gcn"  # paper B.6: 2-layer GCN + classifier (the official GCN has no classifier)
    weighting: str = "nodes"  # FedAvg step: by node count |V_i| (official); "train", "uniform" as FedAvg
    # Topology embedding t_v: "landing" (paper, our reading: diag of (A+I)D⁻¹ powers), "walk" (official
    # walk sampling with the matrix product), "code" (official A * pinverse(D): element-wise). Not searched.
    topology: str = "landing"
    walk_length: int = 5  # k, steps of the embedding (official max_walk_length 5)
    ckr_norm: str = "clients"  # ĉ over clients per class (official); "classes": within each client (OpenFGL)
    num_gen: int = 100  # n pseudo nodes per epoch (official num_gen)
    noise_dim: int = 32  # z dimension (official, hard-coded 32)
    topk: int = 5  # kNN of the pseudo graph, self included as in the official topk (official 5)
    glb_epochs: int = 5  # server epochs per round, each a fresh z (official glb_epochs)
    it_g: int = 1  # generator steps per epoch (official it_g)
    it_d: int = 5  # global-model steps per epoch (official it_d)
    gen_lr: float = 1e-3  # generator Adam (official lr_g)
    distill_lr: float = 1e-3  # global-model Adam on the server (official lr_d); searched log [1e-4, 1e-2]
    server_weight_decay: float = 5e-4  # both server Adams (official args.weight_decay)
    lam1: float = 1.0  # λ1, semantic (CE) term of L_G (official); searched log [0.1, 10]
    lam2: float = 1.0  # λ2, diversity term of L_G (official); searched log [0.1, 10]
    gen_dropout: float = 0.0  # dropout after each generator hidden layer (official 0)

    def __post_init__(self) -> None:
        if self.weighting not in FEDTAD_WEIGHTINGS:
            raise UserError(f"fedtad weighting must be one of {', '.join(FEDTAD_WEIGHTINGS)}, got {self.weighting!r}")
        if self.topology not in TOPOLOGIES:
            raise UserError(f"fedtad topology must be one of {', '.join(TOPOLOGIES)}, got {self.topology!r}")
        if self.ckr_norm not in CKR_NORMS:
            raise UserError(f"fedtad ckr_norm must be one of {', '.join(CKR_NORMS)}, got {self.ckr_norm!r}")
        if self.topk > self.num_gen:
            raise UserError(f"fedtad topk ({self.topk}) cannot exceed num_gen ({self.num_gen})")
        backbone_class(self.backbone)  # an unknown backbone is a UserError naming the choices


# ---- client: class-wise knowledge reliability ------------------------------------------------------


def _self_loop_operator(edge_index: Tensor, num_nodes: int) -> tuple[sp.csr_matrix, np.ndarray]:
    """A + I with unit entries (input self-loops and duplicates dropped) and its degrees."""
    a = to_scipy_sparse_matrix(edge_index.cpu(), None, num_nodes).tocsr()
    a.setdiag(0)
    a.eliminate_zeros()
    a.data[:] = 1.0
    a_hat = (a + sp.identity(num_nodes, format="csr")).tocsr()
    return a_hat, np.asarray(a_hat.sum(axis=1)).ravel()


def landing_probabilities(edge_index: Tensor, num_nodes: int, steps: int, rows: Tensor | None = None) -> Tensor:
    """t_v = [T_vv, (T²)_vv, ..., (T^steps)_vv] with T = (A+I)D⁻¹, for the nodes `rows` (default all).

    T is similar to S = D^-1/2 (A+I) D^-1/2 (T = D^1/2 S D^-1/2), so diag(T^i) = diag(S^i) =
    rowsum(S^⌈i/2⌉ ⊙ S^⌊i/2⌋) for symmetric A; only sparse row blocks of S^1..S^⌈steps/2⌉ are formed.
    Returns [len(rows), steps], float32.
    """
    a_hat, degree = _self_loop_operator(edge_index, num_nodes)
    scale = sp.diags(degree**-0.5)
    s = (scale @ a_hat @ scale).tocsr()
    wanted = np.arange(num_nodes) if rows is None else rows.cpu().numpy()
    out = np.zeros((len(wanted), steps))
    block = 1024  # rows per block: bounds the nnz of S^⌈k/2⌉ held at once on large graphs
    for start in range(0, len(wanted), block):
        chunk = wanted[start : start + block]
        powers = [sp.csr_matrix((np.ones(len(chunk)), (np.arange(len(chunk)), chunk)), shape=(len(chunk), num_nodes))]
        for _ in range((steps + 1) // 2):
            powers.append((powers[-1] @ s).tocsr())
        for i in range(1, steps + 1):
            out[start : start + len(chunk), i - 1] = np.asarray(
                powers[(i + 1) // 2].multiply(powers[i // 2]).sum(axis=1)
            ).ravel()
    return torch.from_numpy(out).float()


def walk_embedding(
    edge_index: Tensor, num_nodes: int, steps: int, generator: torch.Generator, elementwise: bool
) -> Tensor:
    """The official embedding: for each length 1..steps, one walk per node; the visited node ids.

    Each walk starts at its node. `elementwise=False`: a step goes to a uniform member of the node's
    closed neighbourhood (row of D⁻¹(A+I)). `elementwise=True` (official code): the row of
    softmax(A ⊙ D⁺) picks the node itself with weight e^{1/d_v} and every other node with weight 1.
    Returns [N, steps(steps+1)/2], the ids as floats, lengths in order.
    """
    a_hat, degree = _self_loop_operator(edge_index, num_nodes)
    indptr, indices = torch.from_numpy(a_hat.indptr).long(), torch.from_numpy(a_hat.indices).long()
    degree = torch.from_numpy(degree).double()  # of A + I
    stay = torch.exp(1.0 / degree) / (torch.exp(1.0 / degree) + num_nodes - 1)
    columns = []
    for length in range(1, steps + 1):
        current = torch.arange(num_nodes)
        columns.append(current)
        for _ in range(length - 1):
            u = torch.rand(num_nodes, generator=generator, dtype=torch.float64)
            if elementwise:
                other = torch.randint(0, max(num_nodes - 1, 1), (num_nodes,), generator=generator)
                other = other + (other >= current).long()  # uniform over the other N - 1 nodes
                current = torch.where(u < stay[current], current, other)
            else:
                offset = (u * degree[current]).long().clamp(max=degree[current].long() - 1)
                current = indices[indptr[current] + offset]
            columns.append(current)
    return torch.stack(columns, dim=1).float()


def class_reliability(graph: Data, topology: Tensor, num_classes: int) -> Tensor:
    """ckr[c] = Σ_{v train, y_v = c} (1 + Σ_{u∈N(v)} cos(h_v, h_u)) / (|N(v)| + 1), h = [x ∥ t]. [C]"""
    h = F.normalize(torch.cat([graph.x, topology.to(graph.x)], dim=1), dim=1)  # [N, d + k]
    src, dst = graph.edge_index
    keep = graph.train_mask[src]
    src, dst = src[keep], dst[keep]
    similarity = torch.zeros(graph.num_nodes, dtype=h.dtype, device=h.device)
    for start in range(0, src.numel(), 1 << 16):  # chunks bound the [E, d] gathers on large graphs
        s, t = src[start : start + (1 << 16)], dst[start : start + (1 << 16)]
        similarity.index_add_(0, s, (h[s] * h[t]).sum(dim=1))
    count = torch.bincount(src, minlength=graph.num_nodes).to(h.dtype)
    reliability = (1.0 + similarity) / (1.0 + count)  # [N]
    train = graph.train_mask.nonzero().view(-1)
    return torch.zeros(num_classes, dtype=h.dtype, device=h.device).index_add_(0, graph.y[train], reliability[train])


def topology_embedding(graph: Data, params: FedTADParams, seed: int) -> Tensor:
    """t for every node of `graph`, as `params.topology` says ([N, k] or [N, k(k+1)/2])."""
    if params.topology == "landing":
        return landing_probabilities(graph.edge_index, graph.num_nodes, params.walk_length)
    generator = torch.Generator().manual_seed(seed)
    return walk_embedding(graph.edge_index, graph.num_nodes, params.walk_length, generator, params.topology == "code")


class FedTADClient(FedAvgClient):
    """FedAvg's client, plus its class-wise knowledge reliability, computed once and uploaded every round."""

    params: FedTADParams

    def __init__(self, cid: int, graph: Data, model: Backbone, params: FedTADParams, setup: Setup) -> None:
        super().__init__(cid, graph, model, params, setup)
        topology = topology_embedding(graph, params, seed=setup.seed * 100_003 + cid)
        self.reliability = class_reliability(graph, topology, setup.num_classes)  # [C], cached for the run

    def upload(self) -> Message:
        return {**super().upload(), "num_nodes": torch.tensor(self.graph.num_nodes), "reliability": self.reliability}


# ---- server: generator, pseudo graph, distillation ---------------------------------------------------


def normalise_reliability(reliability: Tensor, over: str = "clients") -> Tensor:
    """ĉ from the stacked ckr [M, C]: each column over clients (`clients`) or each row over classes
    (`classes`); a column or row that sums to zero gives zeros."""
    total = reliability.sum(dim=0 if over == "clients" else 1, keepdim=True)
    return torch.where(total > 0, reliability / torch.where(total > 0, total, 1.0), 0.0)


def pseudo_labels(num_gen: int, num_classes: int, device: torch.device | None = None) -> Tensor:
    """⌊n/C⌋ nodes of each class, the remainder to the last class (official `c_cnt`). [n]"""
    counts = torch.full((num_classes,), num_gen // num_classes)
    counts[-1] += num_gen - int(counts.sum())
    return torch.repeat_interleave(torch.arange(num_classes), counts).to(device)


def node_weights(reliability: Tensor, labels: Tensor) -> Tensor:
    """w[i, v] = ĉ[i, y_v] / n_{y_v}: a sum over nodes with w is Σ_c ĉ[i, c] × the class-c mean. [M, n]

    The class counts are summed with `index_add_` into the C known bins: `torch.bincount` would read the
    labels' maximum back from a GPU first, a host round trip every round."""
    counts = torch.zeros(reliability.shape[1], dtype=labels.dtype, device=labels.device)
    counts = counts.index_add_(0, labels, torch.ones_like(labels)).clamp(min=1).to(reliability)
    return reliability[:, labels] / counts[labels]


class PseudoGraphGenerator(nn.Module):
    """G(z, y): label embedding (C → C) ∥ z → Linear-tanh 64, 128, 256 (each with dropout) → Linear d."""

    def __init__(self, noise_dim: int, num_classes: int, out_dim: int, dropout: float) -> None:
        super().__init__()
        self.label_embedding = nn.Embedding(num_classes, num_classes)
        layers: list[nn.Module] = []
        width = noise_dim + num_classes
        for out in GENERATOR_WIDTHS:
            layers += [nn.Linear(width, out), nn.Tanh(), nn.Dropout(dropout)]
            width = out
        self.hidden = nn.Sequential(*layers)
        self.features = nn.Linear(width, out_dim)

    def forward(self, z: Tensor, labels: Tensor) -> Tensor:
        """[n, noise_dim], [n] → pseudo node features [n, d]."""
        return self.features(self.hidden(torch.cat([self.label_embedding(labels), z], dim=1)))


def knn_edges(x: Tensor, k: int) -> Tensor:
    """Symmetrised cosine top-k graph on the rows of x (self counted among the k, as in the official
    `construct_graph`), self-loops removed, coalesced. The similarity is formed one row block at a
    time and only the k indices per row are kept. [2, E], on the host.

    The neighbour indices [n, k] come to the host in one copy, and the edge list is finished there:
    its length (self-loops removed, duplicates merged) depends on the data, which on a GPU would cost
    a host round trip for each of the mask and the coalescing, and the pseudo graph's operator is built
    on the host anyway (`graph_ops`, through scipy)."""
    unit = F.normalize(x.detach(), dim=1)
    blocks = [(unit[start : start + 4096] @ unit.T).topk(k, dim=1).indices for start in range(0, unit.shape[0], 4096)]
    top = torch.cat(blocks).cpu()  # [n, k]
    row, col = torch.arange(top.shape[0]).repeat_interleave(k), top.reshape(-1)
    edges = torch.cat([torch.stack([row, col]), torch.stack([col, row])], dim=1)
    return coalesce(edges[:, edges[0] != edges[1]], num_nodes=x.shape[0])


def weighted_l1_gap(student: Tensor, teachers: Tensor, weights: Tensor) -> Tensor:
    """Σ_i Σ_v w[i, v] mean_j |s_vj − t_ivj|; student [n, C], teachers [M, n, C], weights [M, n]."""
    return ((student.unsqueeze(0) - teachers).abs().mean(dim=-1) * weights).sum()


def weighted_cross_entropy(teachers: Tensor, labels: Tensor, weights: Tensor) -> Tensor:
    """Σ_i Σ_v w[i, v] CE(t_iv, y_v); teachers [M, n, C]."""
    m, n, c = teachers.shape
    loss = F.cross_entropy(teachers.reshape(m * n, c), labels.repeat(m), reduction="none").view(m, n)
    return (loss * weights).sum()


def diversity_loss(z: Tensor, x: Tensor) -> Tensor:
    """exp(−mean_{a,b} [‖z_a − z_b‖²/dim z] · [‖x_a − x_b‖₁/dim x]) (official DiversityLoss, metric l1)."""
    noise = (z.unsqueeze(0) - z.unsqueeze(1)).pow(2).mean(dim=-1)  # [n, n], no gradient needed
    # The weights are symmetric, so the gradient through the second argument equals the one through
    # the first: 2D − D.detach() has D's value and the full gradient from one cdist backward.
    one_sided = torch.cdist(x, x.detach(), p=1)  # [n, n]
    features = (2 * one_sided - one_sided.detach()) / x.shape[1]
    return torch.exp(-(noise * features).mean())


class FedTADServer(FedAvgServer):
    """Averages the client models, then distils them into the average on generated pseudo graphs."""

    params: FedTADParams

    def __init__(self, model: Backbone, params: FedTADParams, setup: Setup) -> None:
        super().__init__(model, params, setup)
        device = setup.device
        # Server-only modules come from their own seed, so the clients' RNG stream is untouched.
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(setup.seed + 7919)
            self.generator = PseudoGraphGenerator(
                params.noise_dim, setup.num_classes, setup.num_features, params.gen_dropout
            )
            self.teachers = [self.new_teacher() for _ in range(setup.num_clients)]
        self.generator.to(device)
        self.noise = torch.Generator().manual_seed(setup.seed + 104_729)
        self.labels = pseudo_labels(params.num_gen, setup.num_classes, device)
        decay = params.server_weight_decay
        self.generator_optimizer = torch.optim.Adam(
            self.generator.parameters(), params.gen_lr, weight_decay=decay, foreach=True
        )
        # The global model's Adam is kept across rounds: `average` copies into the same parameters.
        self.optimizer = torch.optim.Adam(self.model.parameters(), params.distill_lr, weight_decay=decay, foreach=True)
        self.last: dict[str, Tensor] = {}  # the round's last values, read from the device once (`diagnostics`)

    def new_teacher(self) -> Backbone:
        """A backbone to hold one client's uploaded weights: frozen, in eval mode."""
        teacher = build_backbone(self.params, self.setup.num_features, self.setup.num_classes).to(self.setup.device)
        return teacher.requires_grad_(False).eval()

    def aggregate(self, rnd: Round, uploads: Mapping[int, Message]) -> None:
        self.average(uploads)
        self.distill(uploads)
        self.global_weights = {k: v.clone() for k, v in model_state(self.model).items()}

    def average(self, uploads: Mapping[int, Message]) -> None:
        """θ ← weighted mean of the client models (node counts by default), loaded into the global model."""
        states = [u["weights"] for u in uploads.values()]
        load_model_state(self.model, weighted_mean(states, client_weights(uploads, self.params.weighting)))

    def distill(self, uploads: Mapping[int, Message]) -> None:
        """`glb_epochs` × (generator steps, then global-model steps) against the uploaded models."""
        p = self.params
        if p.glb_epochs == 0:
            return
        teachers, weights = self.teachers_and_weights(uploads)
        for _ in range(p.glb_epochs):
            z = torch.randn(p.num_gen, p.noise_dim, generator=self.noise).to(self.setup.device)
            generator_loss = self.train_generator(z, teachers, weights)
            gap, scale = self.train_global(z, teachers, weights)
        self.last = {"generator_loss": generator_loss, "distill_gap": gap, "pseudo_row_l1": scale}

    def teachers_and_weights(self, uploads: Mapping[int, Message]) -> tuple[list[Backbone], Tensor]:
        """The uploaded models rebuilt as frozen backbones, and w [M, n] from their reliabilities."""
        while len(self.teachers) < len(uploads):
            self.teachers.append(self.new_teacher())
        teachers = self.teachers[: len(uploads)]
        for teacher, upload in zip(teachers, uploads.values()):
            load_model_state(teacher, upload["weights"])
        stacked = torch.stack([u["reliability"] for u in uploads.values()]).float()  # [M, C]
        reliability = normalise_reliability(stacked, self.params.ckr_norm).to(self.setup.device)
        return teachers, node_weights(reliability, self.labels)

    def pseudo_graph(self, x: Tensor) -> Data:
        """The kNN graph on X̃ with the backbone's operators; x keeps its gradient."""
        graph = Data(edge_index=knn_edges(x, self.params.topk), num_nodes=x.shape[0])
        backbone_class(self.params.backbone).prepare(graph, self.params)
        graph = graph.to(self.setup.device)
        graph.x = x
        return graph

    def train_generator(self, z: Tensor, teachers: list[Backbone], weights: Tensor) -> Tensor:
        """`it_g` steps on L_G = λ1 L_sem − L_dis + λ2 M L_div; only the generator moves. Returns the last
        step's loss (0-dim, on the device: read at the round's end, not at every step)."""
        p = self.params
        self.generator.train()
        self.model.eval()
        loss = torch.full((), float("nan"), device=self.setup.device)
        for _ in range(p.it_g):
            x = self.generator(z, self.labels)  # [n, d]
            graph = self.pseudo_graph(x)
            local = torch.stack([teacher(graph) for teacher in teachers])  # [M, n, C]
            semantic = weighted_cross_entropy(local, self.labels, weights)
            divergence = weighted_l1_gap(self.model(graph), local.detach(), weights)
            loss = p.lam1 * semantic - divergence + p.lam2 * len(teachers) * diversity_loss(z, x)
            parameters = list(self.generator.parameters())
            for param, grad in zip(parameters, torch.autograd.grad(loss, parameters)):
                param.grad = grad
            self.generator_optimizer.step()
        return loss.detach()

    def train_global(self, z: Tensor, teachers: list[Backbone], weights: Tensor) -> tuple[Tensor, Tensor]:
        """`it_d` Adam steps of the global model on the weighted L1 gap to the frozen client models.

        Returns the last step's gap and the mean row L1 norm of X̃ (the scale of the pseudo features,
        to compare with the data's: 1 for row-normalised features), 0-dim on the device."""
        self.generator.eval()
        with torch.no_grad():
            x = self.generator(z, self.labels)
            graph = self.pseudo_graph(x)
            local = torch.stack([teacher(graph) for teacher in teachers])  # [M, n, C]
        self.model.train()
        gap = torch.full((), float("nan"), device=self.setup.device)
        for _ in range(self.params.it_d):
            self.optimizer.zero_grad(set_to_none=True)
            gap = weighted_l1_gap(self.model(graph), local, weights)
            gap.backward()
            self.optimizer.step()
        return gap.detach(), x.abs().sum(dim=1).mean()

    def diagnostics(self) -> dict[str, float]:
        """The round's last generator loss, last weighted L1 gap and last pseudo-feature row L1 norm,
        read from the device in one copy."""
        return dict(zip(self.last, torch.stack(list(self.last.values())).tolist())) if self.last else {}


class FedTAD(Method):
    name = "fedtad"
    title = "FedTAD"
    summary = "whole model and class reliabilities up; server averages, then distils the client models into it on pseudo graphs"
    Params = FedTADParams
    client = FedTADClient
    server = FedTADServer
    # The official training values (hidden 64, weight decay 5e-4, 3 local epochs, 100 rounds), with source lines.
    paper_preset_file = "fedtad.csv"

    @classmethod
    def equivalent(cls, params: FedTADParams, scheme: str, local_epochs: int) -> tuple[str, dict] | None:
        """Without server epochs FedTAD is FedAvg (with its weighting, where FedAvg has it)."""
        if params.glb_epochs != 0 or params.weighting not in ("uniform", "train"):
            return None
        fields = {f.name for f in dataclasses.fields(FedAvgParams)}
        return "fedavg", {k: v for k, v in dataclasses.asdict(params).items() if k in fields}
