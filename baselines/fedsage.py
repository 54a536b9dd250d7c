"""FedSage+ (Zhang et al., NeurIPS 2021): missing-neighbour generators trained jointly across clients,
then FedSage (FedAvg of a GraphSAGE classifier) on the local graphs mended with generated neighbours.

Algorithm (paper §4 and Algorithm 1; official code zkhku/fedsage, `train_locSagePlus.py`,
`fedsage_plus.py`, `utils/mending_graph.py`). M clients, P = `num_pred`, d = feature dimension.

Phase 1, NeighGen: all in round 0, as stages 0..2E of that round (E = `fed_gen_epochs`).
  Stage 0 (nothing comes down). Client i hides a random `hidden_portion` of its validation
    nodes (the official code hides the nodes that are neither train nor test nodes; here those are
    the validation nodes) and keeps the impaired graph Ḡ_i. For every node of Ḡ_i the targets are
    n_v, its number of hidden neighbours, and the features of up to P of them.
    NeighGen: a GraphSAGE encoder gives z_v; dGen ñ_v = ReLU(Linear(z_v)) predicts the missing
    degree; fGen turns z_v + N(0, I) into P feature vectors (Linear 256, Linear 2048, dropout,
    Linear P·d, tanh). Ḡ_i is mended with k_v = min(P, ⌊ñ_v⌋) generated neighbours per node, and an
    auxiliary GraphSAGE classifier reads the mended graph. LocSage+ pretraining, `local_gen_epochs`
    steps of   λ_d·SmoothL1(ñ, n) + λ_f·L_f + λ_c·CE   on the training nodes, where the greedy
    feature loss L_f matches each generated slot p < k_v to its closest true hidden neighbour.
    Then fGen alone stays trainable (encoder, dGen and the auxiliary classifier are frozen, as in
    official `FedSage_Plus`); the client runs the first forward pass of the federated epochs and
    uploads its generated vectors (below).
  Federated epochs e = 0..E-1, two exchanges each:
    stage 2e+1: the server relays each client's generated vectors x̃ (those of the slots p < k_v of
      its training nodes, uploaded in the stage before) to every other client j; j returns the
      gradient of  Σ_slots min_{u ∈ V_j} ‖x̃ − x_u‖² / d  with respect to x̃ (the paper's
      cross-subgraph term).
    stage 2e+2: the server sums the gradients returned for client i and sends them to i, which steps
      on (λ_d L_d + λ_f L_f + λ_c L_c + λ_f Σ_{j≠i} L_f^{(j)}) / M (official `train_fedgen`), chaining
      the relayed gradient through its own fGen, and uploads the next epoch's vectors (after the
      last epoch it mends its graph instead).
  Mending (after stage 2E): the trained NeighGen runs on the client's full local graph and attaches
    k_v generated neighbours to every node v. Generated nodes have no label (y = -1), no global id
    (-1) and are in no mask.
Phase 2, FedSage: from round 0's last stage on, every round is FedAvg of the GraphSAGE classifier
  on the mended graph, with the uniform mean of official `train_fedSagePC`.

What crosses the wire in phase 1: generated feature vectors (never real features, labels or
edges) and, back, gradients with respect to them. The gradient for one generated vector is
2(x̃ − x_u*)/d with u* the nearest real node of the answering client, so it reveals that node's
features to whoever knows x̃. Any exchange of per-node gradients has this exposure; it is the
exchange the FedGMC paper's B.5 describes ("each client receives node representations from other
clients and computes gradients ... sent back"). The official code only simulates it in one process.
Bytes are counted by the runner like any message.

Choices where the official code and the paper part (docs/baselines/fedsage.md):
  - the cross term takes the minimum over all nodes of client j (paper); the official simulation
    draws, per node, P random neighbours of one random node of j and matches against those;
  - mending runs the generator on the full local graph (paper: NeighGen recovers the neighbours G_i
    lacks); the official code runs it on the impaired graph and attaches the outputs to the matching
    nodes of the full graph, so hidden nodes get no generated neighbours;
  - L_f sums over the slots that have a true hidden neighbour to match; the official greedy loss
    also pulls every other slot towards zero with the batch's mean square.
Evaluation: each client's classifier right after local training, on its own validation/test nodes of
its mended local graph, plain client mean, best validation round (protocol). The official code
instead evaluates the single final FedAvg classifier on the whole global graph at the union of the
clients' test nodes, after a fixed 20 rounds; OpenFGL evaluates locally on the mended graph, as here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch_geometric.data import Data
from torch_geometric.nn import SAGEConv
from torch_geometric.utils import subgraph

from gflbench.backbones import Backbone, GraphSAGE, backbone_class
from gflbench.backbones.dropout import dropout
from gflbench.backbones.graph_ops import binary_adjacency
from gflbench.baselines.fedavg import FedAvgClient, FedAvgParams, FedAvgServer
from gflbench.core.method import (
    SHARED_SEARCH_SPACE,
    Message,
    Method,
    MethodParams,
    Round,
    Setup,
    at_least,
    log_range,
    non_negative,
    positive,
    unit_interval,
)
from gflbench.errors import UserError


@dataclass(frozen=True)
class FedSagePlusParams(FedAvgParams):
    """Classifier: the shared defaults (hidden 128, Adam lr 0.01, ...; paper B.6). NeighGen: official config."""

    search_space = {**SHARED_SEARCH_SPACE, "gen_lr": log_range(1e-3, 1e-1)}  # GraphSAGE is part of the method

    bounds = {
        "num_pred": at_least(1), "hidden_portion": unit_interval(), "gen_hidden": at_least(1), "latent_dim": at_least(1),
        "gen_lr": positive(), "gen_weight_decay": non_negative(), "local_gen_epochs": non_negative(),
        "fed_gen_epochs": non_negative(), "degree_weight": non_negative(), "feature_weight": non_negative(),
        "class_weight": non_negative(),
    }  # fmt: skip

    backbone: str = "sage"  # paper B.6: GraphSAGE encoder
    weighting: str = "uniform"  # official train_fedSagePC: 1/num_owners
    num_pred: int = 5  # P, most generated neighbours per node (official config.num_pred)
    hidden_portion: float = 0.5  # share of validation nodes hidden (official config.hidden_portion)
    gen_hidden: int = 32  # NeighGen encoder and auxiliary classifier width (official config.hidden)
    latent_dim: int = 128  # z (official config.latent_dim)
    # NeighGen Adam. OpenFGL's 1e-2, chosen over the official config.lr 1e-3 by validation (Cora, METIS
    # 10 clients, docs/baselines/fedsage.md): at 1e-3, 20 + 20 steps leave ⌊ñ⌋ = 0 at every node.
    gen_lr: float = 1e-2
    gen_weight_decay: float = 1e-4  # (official config.weight_decay)
    local_gen_epochs: int = 20  # LocSage+ pretraining steps (official config.gen_epochs)
    fed_gen_epochs: int = 20  # federated fGen steps (official train_fedgen runs config.gen_epochs)
    degree_weight: float = 1.0  # λ_d (official config.a)
    feature_weight: float = 1.0  # λ_f (official config.b)
    class_weight: float = 1.0  # λ_c (official config.c)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_pred < 1 or not 0.0 <= self.hidden_portion <= 1.0:
            raise UserError("fedsage+ needs num_pred >= 1 and 0 <= hidden_portion <= 1")
        if self.local_gen_epochs < 0 or self.fed_gen_epochs < 0:
            raise UserError("fedsage+ generator epochs must be >= 0")


def generator_stages(params: FedSagePlusParams) -> int:
    """Exchanges of phase 1 (stage 0, then two per federated epoch); round 0's next stage is FedAvg."""
    return 1 + 2 * params.fed_gen_epochs


class NeighGen(nn.Module):
    """Encoder (2 GraphSAGE layers), dGen and fGen of the paper's §4.2 (official `LocalSage_Plus`)."""

    def __init__(self, in_dim: int, hidden: int, latent: int, num_pred: int, dropout: float) -> None:
        super().__init__()
        self.num_pred, self.in_dim, self.dropout = num_pred, in_dim, dropout
        self.encoder = nn.ModuleList([SAGEConv(in_dim, hidden), SAGEConv(hidden, latent)])
        self.dgen = nn.Linear(latent, 1)
        self.fgen = nn.ModuleList([nn.Linear(latent, 256), nn.Linear(256, 2048), nn.Linear(2048, num_pred * in_dim)])

    def encode(self, x: Tensor, adj: Tensor) -> Tensor:
        h = dropout(F.relu(self.encoder[0](x, adj)), self.dropout, self.training)
        return F.relu(self.encoder[1](h, adj))

    def missing_degree(self, z: Tensor) -> Tensor:
        return F.relu(self.dgen(z)).squeeze(-1)

    def generate(self, z: Tensor) -> Tensor:
        """[n, P, d] generated neighbour features; the Gaussian input noise is part of the generator."""
        h = F.relu(self.fgen[0](z + torch.randn_like(z)))
        h = dropout(F.relu(self.fgen[1](h)), self.dropout, self.training)
        return torch.tanh(self.fgen[2](h)).view(z.shape[0], self.num_pred, self.in_dim)


def slot_counts(missing_degree: Tensor, num_pred: int) -> Tensor:
    """k_v = min(P, ⌊ñ_v⌋): how many generated neighbours node v gets (official casts to int)."""
    return missing_degree.detach().floor().clamp(0, num_pred).long()


def mend(x: Tensor, edge_index: Tensor, slots: Tensor, generated: Tensor) -> tuple[Tensor, Tensor]:
    """Append the generated neighbours: node v gets slots[v] new nodes, each linked to v both ways.

    `generated` holds P vectors for each node with slots > 0, in node order; new nodes follow in
    (node, slot) order. Returns the mended features and edge index.
    """
    n, num_pred = x.shape[0], generated.shape[1]
    active = slots[slots > 0]
    take = torch.arange(num_pred, device=x.device) < active.unsqueeze(1)
    anchors = torch.arange(n, device=x.device)[slots > 0].repeat_interleave(active)
    new = torch.arange(n, n + anchors.numel(), device=x.device)
    links = torch.stack([torch.cat([anchors, new]), torch.cat([new, anchors])])
    return torch.cat([x, generated[take]]), torch.cat([edge_index, links], dim=1)


def greedy_feature_loss(generated: Tensor, slots: Tensor, targets: Tensor, missing: Tensor) -> Tensor:
    """Σ over slots p < slots[v] of min over the true missing neighbours q < min(P, n_v) of MSE(x̃_vp, x_vq).

    Nodes without a true missing neighbour add nothing. Shapes: generated, targets [m, P, d]; slots,
    missing [m]. The caller normalises.
    """
    num_pred = generated.shape[1]
    mse = (generated.unsqueeze(2) - targets.unsqueeze(1)).pow(2).mean(-1)  # [m, P generated, P true]
    arange = torch.arange(num_pred, device=generated.device)
    real = arange < missing.clamp(max=num_pred).unsqueeze(1)  # [m, P true]
    best = mse.masked_fill(~real.unsqueeze(1), float("inf")).min(dim=2).values  # [m, P generated]
    counted = (arange < slots.unsqueeze(1)) & real.any(dim=1, keepdim=True)
    return best[counted].sum()


def nearest_feature_gradient(generated: Tensor, features: Tensor) -> Tensor:
    """∂/∂x̃ of Σ_s min_u ‖x̃_s − x_u‖² / d: what a client returns for another client's generated vectors."""
    if generated.shape[0] == 0 or features.shape[0] == 0:
        return torch.zeros_like(generated)
    distance = generated.pow(2).sum(1, keepdim=True) - 2 * generated @ features.T + features.pow(2).sum(1)
    nearest = features[distance.argmin(dim=1)]
    return 2 * (generated - nearest) / generated.shape[1]


@dataclass
class ImpairedGraph:
    """Ḡ_i and the NeighGen targets of its training nodes."""

    x: Tensor
    edge_index: Tensor
    adj: Tensor
    y: Tensor
    train: Tensor  # positions of the training nodes in Ḡ_i
    missing: Tensor  # n_v of the training nodes
    targets: Tensor  # [train, P, d] features of up to P hidden neighbours, zero-padded


def impair(graph: Data, train_index: Tensor, hidden_portion: float, num_pred: int) -> ImpairedGraph:
    """Hide a random `hidden_portion` of the validation nodes; record what each training node lost."""
    n, device = graph.num_nodes, graph.x.device
    val = graph.val_mask.nonzero().view(-1)
    hidden = torch.zeros(n, dtype=torch.bool, device=device)
    hidden[val[torch.randperm(val.numel(), device=device)[: int(hidden_portion * val.numel())]]] = True
    keep = (~hidden).nonzero().view(-1)
    edge_index, _ = subgraph(keep, graph.edge_index, relabel_nodes=True, num_nodes=n)
    position = torch.full((n,), -1, dtype=torch.long, device=device)
    position[keep] = torch.arange(keep.numel(), device=device)

    row, col = graph.edge_index
    lost = ~hidden[row] & hidden[col] & (row != col)
    row, col = row[lost], col[lost]
    order = torch.argsort(row * n + col)
    row, col = row[order], col[order]
    missing = torch.bincount(row, minlength=n)
    first = torch.cumsum(missing, 0) - missing
    rank = torch.arange(row.numel(), device=device) - first[row]
    targets = torch.zeros(n, num_pred, graph.x.shape[1], device=device)
    listed = rank < num_pred
    targets[row[listed], rank[listed]] = graph.x[col[listed]]
    return ImpairedGraph(
        x=graph.x[keep],
        edge_index=edge_index,
        adj=binary_adjacency(edge_index.cpu(), keep.numel()).to(device),
        y=graph.y[keep],
        train=position[train_index],
        missing=missing[train_index].float(),
        targets=targets[train_index],
    )


class FedSagePlusClient(FedAvgClient):
    """Phase 1: trains its NeighGen (locally, then fGen with the other clients' gradients) and mends
    its graph. Phase 2: a FedAvg client of the GraphSAGE classifier on the mended graph."""

    def __init__(self, cid: int, graph: Data, model: Backbone, params: MethodParams, setup: Setup) -> None:
        super().__init__(cid, graph, model, params, setup)
        self.pending: tuple[Tensor, Tensor] | None = None  # (own loss, uploaded vectors) awaiting the relayed gradient
        self.missing_degree: Tensor | None = None  # ñ of every local node at mending, kept for inspection

    def trains_locally(self, rnd: Round) -> bool:
        """Phase 2 (the classifier on the mended graph) is FedAvg's local step."""
        return rnd.index > 0 or rnd.stage >= generator_stages(self.params)

    def fit(self, rnd: Round, message: Message) -> Message:
        if self.trains_locally(rnd):
            return super().fit(rnd, message)
        if rnd.stage == 0:
            self.start_generator()
        elif rnd.stage % 2 == 1:
            received = message["generated"].items()
            return {"gradients": {i: nearest_feature_gradient(g, self.graph.x) for i, g in received}}
        else:
            self.generator_step(message["gradient"])
        if rnd.stage == generator_stages(self.params) - 1:
            self.mend_graph()
            return {}
        return {"generated": self.generator_forward()}

    def start_generator(self) -> None:
        """Build Ḡ_i and NeighGen, pretrain it locally (LocSage+), then freeze all but fGen."""
        p, setup = self.params, self.setup
        self.impaired = impair(self.graph, self.train_index, p.hidden_portion, p.num_pred)
        self.neighgen = NeighGen(setup.num_features, p.gen_hidden, p.latent_dim, p.num_pred, p.dropout).to(setup.device)
        self.aux_classifier = GraphSAGE(setup.num_features, p.gen_hidden, setup.num_classes, p.dropout).to(setup.device)
        modules = nn.ModuleList([self.neighgen, self.aux_classifier])
        optimizer = torch.optim.Adam(modules.parameters(), lr=p.gen_lr, weight_decay=p.gen_weight_decay)
        if self.num_train > 0:
            for _ in range(p.local_gen_epochs):
                optimizer.zero_grad(set_to_none=True)
                loss, _ = self.generator_loss()
                loss.backward()
                optimizer.step()
        modules.requires_grad_(False)
        self.neighgen.fgen.requires_grad_(True)
        fgen = self.neighgen.fgen.parameters()
        self.gen_optimizer = torch.optim.Adam(fgen, lr=p.gen_lr, weight_decay=p.gen_weight_decay)

    def generator_loss(self) -> tuple[Tensor, Tensor]:
        """λ_d L_d + λ_f L_f + λ_c L_c on Ḡ_i, and the generated vectors of the training nodes' slots."""
        p, g = self.params, self.impaired
        self.neighgen.train()
        self.aux_classifier.train()
        z = self.neighgen.encode(g.x, g.adj)
        degree = self.neighgen.missing_degree(z)
        slots = slot_counts(degree, p.num_pred)
        generated = self.neighgen.generate(z[slots > 0])
        x, edge_index = mend(g.x, g.edge_index, slots, generated)
        mended = Data(x=x, adj=binary_adjacency(edge_index.cpu(), x.shape[0]).to(x.device))
        logits = self.aux_classifier(mended)[g.train]

        row = torch.full_like(slots, -1)
        row[slots > 0] = torch.arange(generated.shape[0], device=slots.device)
        train_rows, train_slots = row[g.train], slots[g.train]
        counted = train_slots > 0
        own = generated[train_rows[counted]]
        feature = greedy_feature_loss(own, train_slots[counted], g.targets[counted], g.missing[counted])
        loss = (
            p.degree_weight * F.smooth_l1_loss(degree[g.train], g.missing)
            + p.feature_weight * feature / self.feature_scale()
            + p.class_weight * F.cross_entropy(logits, g.y[g.train])
        )
        take = torch.arange(p.num_pred, device=slots.device) < train_slots[counted].unsqueeze(1)
        return loss, own[take]

    def feature_scale(self) -> float:
        """The greedy losses are means over the training nodes' P slots (official: mean of the slot tensor)."""
        return float(max(self.num_train, 1) * self.params.num_pred)

    def generator_forward(self) -> Tensor:
        """Forward pass of a federated epoch; keeps the graph until the other clients' gradients arrive."""
        if self.num_train == 0:
            self.pending = None
            return torch.zeros(0, self.setup.num_features, device=self.setup.device)
        self.pending = self.generator_loss()
        return self.pending[1].detach()

    def generator_step(self, gradient: Tensor) -> None:
        """One fGen step on (own loss + λ_f Σ_j cross term) / M, the cross term through the relayed gradient."""
        if self.pending is None:
            return
        loss, generated = self.pending
        cross = (generated * gradient).sum() * self.params.feature_weight / self.feature_scale()
        ((loss + cross) / self.setup.num_clients).backward()
        self.gen_optimizer.step()
        self.gen_optimizer.zero_grad(set_to_none=True)  # all M generators live at once: keep no idle gradients
        self.pending = None

    @torch.no_grad()
    def mend_graph(self) -> None:
        """Replace the local graph by its mended copy (original nodes keep their indices) and drop NeighGen."""
        graph, n = self.graph, self.graph.num_nodes
        self.neighgen.eval()
        z = self.neighgen.encode(graph.x, binary_adjacency(graph.edge_index.cpu(), n).to(graph.x.device))
        self.missing_degree = self.neighgen.missing_degree(z)
        slots = slot_counts(self.missing_degree, self.params.num_pred)
        x, edge_index = mend(graph.x, graph.edge_index, slots, self.neighgen.generate(z[slots > 0]))
        extra = x.shape[0] - n
        none = torch.zeros(extra, dtype=torch.bool, device=x.device)
        unknown = torch.full((extra,), -1, dtype=torch.long, device=x.device)
        mended = Data(
            x=x,
            edge_index=edge_index,
            y=torch.cat([graph.y, unknown]),
            train_mask=torch.cat([graph.train_mask, none]),
            val_mask=torch.cat([graph.val_mask, none]),
            test_mask=torch.cat([graph.test_mask, none]),
            global_id=torch.cat([graph.global_id, unknown]),
        )
        # the backbone's operators are built on the host (graph_ops goes through scipy): move them to the run's
        # device with the rest, as FederatedData.on_device does for the graphs a run starts from
        backbone_class(self.params.backbone).prepare(mended, self.params)
        self.graph = mended.to(self.setup.device)
        del self.neighgen, self.aux_classifier, self.gen_optimizer, self.impaired


class FedSagePlusServer(FedAvgServer):
    """Phase 1: relays generated vectors out and the gradients back. Phase 2: FedAvg (uniform)."""

    def stages(self, rnd_index: int) -> int:
        return generator_stages(self.params) + 1 if rnd_index == 0 else 1

    def configure(self, rnd: Round, client_ids: list[int]) -> dict[int, Message]:
        if rnd.index > 0 or rnd.stage >= generator_stages(self.params):
            return super().configure(rnd, client_ids)
        if rnd.stage == 0:
            return {cid: {} for cid in client_ids}
        if rnd.stage % 2 == 1:  # each client's vectors to every other client
            return {j: {"generated": {str(i): g for i, g in self.generated.items() if i != j}} for j in client_ids}
        returned = {i: [self.gradients[j][str(i)] for j in client_ids if j != i] for i in client_ids}
        # each client's returned gradients, summed over the answering clients
        return {i: {"gradient": sum(grads, torch.zeros_like(self.generated[i]))} for i, grads in returned.items()}

    def aggregate(self, rnd: Round, uploads: Mapping[int, Message]) -> None:
        if rnd.index > 0 or rnd.stage >= generator_stages(self.params):
            super().aggregate(rnd, uploads)
        elif rnd.stage % 2 == 0:
            self.generated = {cid: u["generated"] for cid, u in uploads.items() if "generated" in u}
        else:
            self.gradients = {cid: u["gradients"] for cid, u in uploads.items()}


class FedSagePlus(Method):
    name = "fedsage+"
    needs_every_client = "its round-0 NeighGen phase exchanges generated vectors between all clients"
    title = "FedSage+"
    summary = "NeighGen trained across clients (generated vectors out, gradients back); FedAvg on mended graphs"
    Params = FedSagePlusParams
    client = FedSagePlusClient
    server = FedSagePlusServer
