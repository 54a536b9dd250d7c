"""FedGNN (Wu et al., 2021), adapted to subgraph node classification as FED-PUB and FedIIH use it.

The original (wuch15/FedPerGNN) is a recommender: a third-party server matches users through
encrypted item ids and sends each user the embeddings of other users who share its items, which the
user attaches to its local graph as extra neighbours ("graph expansion"); model updates are averaged.
FedIIH (app. I.4) describes the node-classification form that the paper's Table 1 row comes from:
"when nodes in two clients have exactly the same neighbours, the nodes with the same neighbours from
other clients are transferred and used to expand the local subgraph"; aggregation is FedAvg. No code
of that adaptation is public; the matching rule below is ours (research notes §2.6).

Algorithm:

  Matching (round 0, stage 0, once: graphs do not change). Every client uploads, for each local node,
  a keyed hash of its global id and a keyed hash of the set of its neighbours' global ids (the key is
  shared by the clients, not by the server, as FedGNN encrypts item ids). The server pairs local node
  v of client c with node u of client c' != c when
    (a) both carry the same id hash: copies of one global node (overlapping partitions), or
    (b) both have the same non-empty neighbour set (FedIIH's rule; empty sets never match).
  Each round:
  1. The server sends the global weights, for each of the client's matched nodes v the embeddings
     of its remote partners u (from their owners' previous upload) with v as the anchor, and the list
     of the client's own nodes that other clients need.
  2. The client expands its subgraph: each received embedding becomes an extra neighbour of its
     anchor in the second GCN layer, where it stands in for the remote node's first-layer output
     (the recommender attaches remote user embeddings at the GNN input in the same way). It trains
     the GCN on the expanded graph and uploads its weights, its number of training nodes, and the
     first-layer embeddings ReLU(conv1(x)) of the requested nodes only (eval mode, after training).
  3. The server takes the training-size-weighted mean of the weights (FedAvg) and keeps the
     embeddings for routing in the next round.

In the disjoint METIS scheme clients hold induced subgraphs, so no global node is held twice and two
nodes of different clients can never have the same (non-empty) set of neighbours: nothing matches,
no embedding travels, and FedGNN trains exactly like FedAvg on the same GCN (test_fedgnn checks
it). `diagnostics()` records the match counts of every run.

Not carried over from the recommender: the pseudo-interacted items and the local-differential-privacy
noise on the updates (privacy measures for rating data, with no counterpart in the paper's B.5
description), SGD with batches (the protocol trains full-batch with Adam), and the GAT layers
(paper B.6 puts FedGNN on the 2-layer GCN + classifier). Evaluation follows the protocol: each
client's model right after local training, on its own nodes of its (expanded) subgraph.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F
from torch_geometric.data import Data

from gflbench.backbones import Backbone
from gflbench.backbones.dropout import dropout
from gflbench.backbones.graph_ops import gcn_adjacency
from gflbench.baselines.fedavg import FedAvgClient, FedAvgParams, FedAvgServer
from gflbench.core.method import SHARED_SEARCH_SPACE, Message, Method, MethodParams, Round, Setup
from gflbench.errors import UserError

MATCHING = Round(0, 0)  # the exchange in which clients upload node hashes and the server matches them


@dataclass(frozen=True)
class FedGNNParams(FedAvgParams):
    search_space = SHARED_SEARCH_SPACE  # the method expands the GCN's second layer: no backbone choice

    backbone: str = "gcn"  # paper B.6 (FedIIH app. I.5): 2-layer GCN + classifier

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.backbone != "gcn":
            raise UserError("fedgnn expands the second GCN layer of the gcn backbone; backbone must be gcn")


def keyed_hashes(values: list[bytes], key: bytes) -> Tensor:
    """64-bit keyed BLAKE2b of each byte string, as int64: equal inputs match, the server learns no ids."""
    digests = [hashlib.blake2b(v, key=key, digest_size=8).digest() for v in values]
    return torch.tensor([int.from_bytes(d, "little", signed=True) for d in digests], dtype=torch.long)


def node_hashes(global_id: Tensor, edge_index: Tensor, key: bytes) -> dict[str, Tensor]:
    """Per local node: hash of its global id, hash of its sorted neighbour-id set, whether it has one."""
    gid = global_id.cpu().numpy().astype(np.int64)
    row, col = edge_index.cpu().numpy()
    neighbours: list[set[int]] = [set() for _ in gid]
    for r, c in zip(row.tolist(), col.tolist()):
        if r != c:
            neighbours[r].add(int(gid[c]))
    return {
        "id_hash": keyed_hashes([b"id" + int(g).to_bytes(8, "little") for g in gid], key),
        "neighbour_hash": keyed_hashes(
            [b"nb" + np.array(sorted(s), dtype=np.int64).tobytes() for s in neighbours], key
        ),
        "has_neighbours": torch.tensor([bool(s) for s in neighbours]),
    }


def match_nodes(uploads: Mapping[int, Message]) -> set[tuple[int, int, int, int]]:
    """Pairs (client c, node v, client c', node u), c != c', with equal id hashes or equal non-empty neighbour sets."""
    groups: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for cid, upload in uploads.items():
        has = upload["has_neighbours"].tolist()
        for v, (h, nh) in enumerate(zip(upload["id_hash"].tolist(), upload["neighbour_hash"].tolist())):
            groups[("id", h)].append((cid, v))
            if has[v]:
                groups[("nb", nh)].append((cid, v))
    pairs = set()
    for members in groups.values():
        for c, v in members:
            pairs.update((c, v, c2, u) for c2, u in members if c2 != c)
    return pairs


class FedGNNClient(FedAvgClient):
    """A FedAvg client whose GCN reads received remote embeddings as extra second-layer neighbours."""

    def __init__(self, cid: int, graph: Data, model: Backbone, params: MethodParams, setup: Setup) -> None:
        super().__init__(cid, graph, model, params, setup)
        self.remote: Tensor | None = None  # [R, hidden] embeddings of remote partners, row k attached to anchors[k]
        self.anchors: Tensor | None = None
        self.expanded_adj: Tensor | None = None  # GCN operator over local nodes + remote rows

    def hashes(self) -> Message:
        # the clients' common secret (official FedGNN: item-id encryption key); from the run seed for reproducibility
        key = hashlib.sha256(f"fedgnn-clients-{self.setup.seed}".encode()).digest()
        return node_hashes(self.graph.global_id, self.graph.edge_index, key)

    def expand(self, anchors: Tensor, remote: Tensor) -> None:
        """Attach row k of `remote` to local node anchors[k]; the structure is fixed, so the operator is built once."""
        if anchors.numel() == 0:
            self.remote = None
            return
        if self.anchors is None or not torch.equal(self.anchors, anchors):
            n = self.graph.num_nodes
            extra = torch.arange(n, n + anchors.numel(), device=anchors.device)
            links = torch.stack([torch.cat([anchors, extra]), torch.cat([extra, anchors])])
            edge_index = torch.cat([self.graph.edge_index, links], dim=1)
            self.expanded_adj = gcn_adjacency(edge_index.cpu(), n + anchors.numel()).to(anchors.device)
            self.anchors = anchors
        self.remote = remote

    def logits(self) -> Tensor:
        """The GCN forward (backbones.GCN) with the remote embeddings joining the first layer's output."""
        if self.remote is None:
            return self.model(self.graph)
        model, n = self.model, self.graph.num_nodes
        h = F.relu(model.conv1(self.graph.x, self.graph.gcn_adj))
        h = dropout(torch.cat([h, self.remote]), model.dropout, model.training)
        h = model.conv2(h, self.expanded_adj)[:n]
        return model.classifier(dropout(F.relu(h), model.dropout, model.training))

    def loss(self) -> Tensor:
        return F.cross_entropy(self.logits()[self.train_index], self.graph.y[self.train_index])

    @torch.no_grad()
    def predict(self) -> Tensor:
        self.model.eval()
        return self.logits()

    @torch.no_grad()
    def embeddings(self, nodes: Tensor) -> Tensor:
        """First-layer embeddings of `nodes` from the freshly trained model (what a remote partner attaches)."""
        self.model.eval()
        return F.relu(self.model.conv1(self.graph.x, self.graph.gcn_adj))[nodes]

    def fit(self, rnd: Round, message: Message) -> Message:
        if rnd == MATCHING:
            return self.hashes()
        self.expand(message["anchors"], message["remote"])
        upload = super().fit(rnd, message)
        upload["embeddings"] = self.embeddings(message["share"])
        return upload


class FedGNNServer(FedAvgServer):
    """FedAvg plus the matching service: pairs nodes by hash once, then routes embeddings every round."""

    def __init__(self, model: Backbone, params: FedGNNParams, setup: Setup) -> None:
        super().__init__(model, params, setup)
        self.share: dict[int, Tensor] = {}  # per client: its local nodes whose embeddings others need
        self.anchors: dict[int, Tensor] = {}  # per client: local anchor of each remote row it receives
        self.sources: dict[int, Tensor] = {}  # per client: row of each remote embedding in the uploads' concatenation
        self.embeddings: Tensor | None = None  # last uploaded embeddings, concatenated in client order

    def stages(self, rnd_index: int) -> int:
        return 2 if rnd_index == 0 else 1  # round 0 starts with the matching exchange

    def configure(self, rnd: Round, client_ids: list[int]) -> dict[int, Message]:
        if rnd == MATCHING:
            return {cid: {} for cid in client_ids}
        messages = super().configure(rnd, client_ids)
        device = self.setup.device
        for cid in client_ids:
            routed = self.embeddings is not None
            messages[cid] = {
                **messages[cid],
                "share": self.share[cid],
                "anchors": self.anchors[cid] if routed else torch.zeros(0, dtype=torch.long, device=device),
                "remote": (
                    self.embeddings[self.sources[cid]] if routed else torch.zeros(0, self.params.hidden, device=device)
                ),
            }
        return messages

    def global_model(self, cid: int) -> None:
        """None: a client's forward reads the embeddings routed to it, so the global weights alone are not a
        model any party deploys."""
        return None

    def aggregate(self, rnd: Round, uploads: Mapping[int, Message]) -> None:
        if rnd == MATCHING:
            self.route(match_nodes(uploads), list(uploads))
            return
        super().aggregate(rnd, uploads)
        self.embeddings = torch.cat([uploads[cid]["embeddings"] for cid in sorted(uploads)])

    def route(self, pairs: set[tuple[int, int, int, int]], client_ids: list[int]) -> None:
        """Which nodes each client shares, and where each shared row goes."""
        device = self.setup.device
        requested = {cid: sorted({u for _, _, c2, u in pairs if c2 == cid}) for cid in sorted(client_ids)}
        row, start = {}, 0  # row of (owner, node) once the owners' uploads are concatenated in client order
        for cid, nodes in requested.items():
            row.update({(cid, u): start + k for k, u in enumerate(nodes)})
            start += len(nodes)
        for cid in client_ids:
            mine = sorted(p for p in pairs if p[0] == cid)
            self.share[cid] = torch.tensor(requested[cid], dtype=torch.long, device=device)
            self.anchors[cid] = torch.tensor([v for _, v, _, _ in mine], dtype=torch.long, device=device)
            rows = [row[(c2, u)] for _, _, c2, u in mine]
            self.sources[cid] = torch.tensor(rows, dtype=torch.long, device=device)

    def diagnostics(self) -> dict[str, float]:
        """How much matching happened: remote partners attached, local nodes expanded, embeddings shared."""
        return {
            "matched_pairs": float(sum(a.numel() for a in self.anchors.values())),
            "matched_nodes": float(sum(a.unique().numel() for a in self.anchors.values())),
            "shared_embeddings": float(sum(s.numel() for s in self.share.values())),
        }


class FedGNN(Method):
    name = "fedgnn"
    needs_every_client = (
        "its round-0 matching pairs every client's nodes, and each round routes every client's embeddings"
    )
    title = "FedGNN"
    summary = "FedAvg; embeddings of nodes matched across clients (same id or neighbours) expand local graphs"
    Params = FedGNNParams
    client = FedGNNClient
    server = FedGNNServer

    @classmethod
    def equivalent(cls, params: FedGNNParams, scheme: str, local_epochs: int) -> tuple[str, dict] | None:
        """Non-overlapping clients share no node and no neighbour set: nothing matches, no graph expands."""
        return ("fedavg", dataclasses.asdict(params)) if scheme == "metis" else None
