"""Node split and client partitions (paper B.3-B.4, protocol §1.1).

The train/val/test split is drawn once over the whole graph, before partitioning, and each client
sees the slice of it that falls on its nodes. Non-overlapping: METIS into M parts, induced
subgraphs. Overlapping: METIS into M/5 parts, each shared by 5 clients that each hold a random half
of the part's nodes. Beyond the paper (issue 32, docs/protocol.md "Partition schemes beyond the
paper"): `louvain`, Louvain communities merged into M clients as OpenFGL does, and `dirichlet-<α>`,
label skew, each class's nodes spread over the clients by Dirichlet(α) proportions. Every scheme is
fixed by the data seed, independent of the run seed, and cached on disk.

A scheme is named by one label, the string that enters the run key (`spec.run_key_of`) and the cache
file's name: `metis`, `overlap`, `louvain`, `dirichlet-0.5` (α written as Python's repr of the float,
so `dirichlet-.50` and `dirichlet --alpha 0.5` are one label). Labels of the paper's two schemes are
what they always were, so no stored run changes its key.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pymetis
import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.utils import subgraph

from gflbench.data import DATA_DIR_ENV, partial_path, remove_stale_partials, say_verbose
from gflbench.errors import UserError

SCHEMES: dict[str, tuple[int, ...]] = {"metis": (5, 10, 20), "overlap": (10, 30, 50)}  # the paper's, its counts
EXTRA_SCHEMES: dict[str, tuple[int, ...]] = {"louvain": (5, 10, 20), "dirichlet": (5, 10, 20)}  # default counts
ALPHA_SCHEMES = ("dirichlet",)  # schemes whose label carries α
FILE_PREFIX = "file-"  # a split manifest's label: file-<first 16 hex digits of its sha256> (gfl_bench/data/manifest.py)
LOUVAIN_RESOLUTION = 1.0  # networkx's default and OpenFGL's (`--louvain_resolution 1`)
LOUVAIN_DELTA = 20  # OpenFGL's `louvain_delta`: the slack (nodes) of the merge's client capacity
DIRICHLET_MIN_NODES = 10  # a Dirichlet draw giving a client fewer nodes is redrawn (OpenFGL: `least_samples`)
DIRICHLET_DRAWS = 100  # draws before giving up (OpenFGL: `dirichlet_try_cnt`)
CLIENTS_PER_PART = 5  # overlapping scheme: clients that share one METIS part
DEFAULT_DATA_SEED = 1234  # the protocol's fixed data seed (FED-PUB generators)
MAX_DATA_SEED = 2**32 - 1  # METIS keeps a seed's low 32 bits (check_data_seed)
TRAIN, VAL, TEST = 0, 1, 2


@dataclass(frozen=True)
class Partition:
    """Which global nodes each client holds, and the global split they inherit."""

    scheme: str
    data_seed: int
    split: Tensor  # [N] int8 codes TRAIN / VAL / TEST
    client_nodes: tuple[Tensor, ...]  # sorted global node ids per client

    @property
    def num_clients(self) -> int:
        return len(self.client_nodes)

    def digest(self) -> str:
        """Content hash stored with each run record, so a reviewer can tell two partitions apart."""
        h = hashlib.sha256(self.split.numpy().tobytes())
        for nodes in self.client_nodes:
            h.update(np.int64(nodes.numel()).tobytes())
            h.update(nodes.numpy().astype(np.int64).tobytes())
        return h.hexdigest()[:16]


def scheme_label(name: str, alpha: float | None = None) -> str:
    """The one label of `name` (with `--alpha` where the scheme takes one) that keys and caches use.

    `name` may already be a label (`dirichlet-0.5`), which is how a table names a Dirichlet scheme
    (its `--alpha` is the significance level). Raises UserError for an unknown scheme, a Dirichlet
    scheme without α or with α <= 0, and α given to a scheme that takes none.
    """
    base, _, given = name.partition("-")
    if name.startswith(FILE_PREFIX) and alpha is None:
        if len(given) == 16 and all(c in "0123456789abcdef" for c in given):
            return name
        raise UserError(f"{name!r} is not a split manifest's label (file-<16 hex digits>); pass --partition-file")
    if base not in SCHEMES and base not in EXTRA_SCHEMES:
        choices = ", ".join([*SCHEMES, *EXTRA_SCHEMES])
        raise UserError(f"unknown partition scheme {name!r}; choose from {choices} (dirichlet with --alpha)")
    if base not in ALPHA_SCHEMES:
        if given or alpha is not None:
            raise UserError(f"--alpha applies to the dirichlet scheme only, not {base}")
        return base
    if given and alpha is not None:
        raise UserError(f"the scheme {name!r} already names its alpha; drop --alpha {alpha}")
    if not given and alpha is None:
        raise UserError(f"the {base} scheme needs --alpha (its concentration, e.g. 0.5), or the label {base}-0.5")
    try:
        value = float(given) if given else float(alpha)  # type: ignore[arg-type]
    except ValueError:
        raise UserError(f"{name!r}: alpha {given!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise UserError(f"the {base} scheme's alpha must be a positive number, got {value}")
    return f"{base}-{value!r}"


def scheme_alpha(label: str) -> float | None:
    """α of a Dirichlet label (already checked), else None."""
    base, _, given = label.partition("-")
    return float(given) if base in ALPHA_SCHEMES else None


def scheme_title(label: str) -> str:
    """How a figure or caption names a scheme's label: the paper's words for its two, else the label's."""
    base = label.partition("-")[0]
    if label.startswith(FILE_PREFIX):
        return f"split file {label[len(FILE_PREFIX) :]}"
    if base in ALPHA_SCHEMES:
        return f"{base} α={scheme_alpha(label):g}"
    return {"metis": "non-overlapping", "overlap": "overlapping"}.get(base, base)


def default_clients(label: str) -> tuple[int, ...]:
    """The client counts a scheme runs when `--clients` is not given: the paper's for its two."""
    base = label.partition("-")[0]
    if label.startswith(FILE_PREFIX):
        raise UserError(f"the clients of {label} are its manifest's: pass the file with --partition-file")
    return SCHEMES.get(base) or EXTRA_SCHEMES[base]


def check_scheme(scheme: str) -> None:
    if scheme_label(scheme) != scheme:
        raise UserError(f"partition scheme {scheme!r} is not written as gflbench writes it: {scheme_label(scheme)!r}")


def check_clients(scheme: str, num_clients: int) -> None:
    """Reject client counts the scheme cannot make, before any work is done (a Louvain count above the
    communities' is known only once Louvain ran: `louvain_clients` says so then, before any run)."""
    check_scheme(scheme)
    if num_clients < 1:
        raise UserError(f"client count must be positive, got {num_clients}")
    if scheme == "overlap" and num_clients % CLIENTS_PER_PART:
        raise UserError(
            f"the overlap scheme makes clients in groups of {CLIENTS_PER_PART}; {num_clients} is not a multiple"
        )


def split_nodes(num_nodes: int, fractions: tuple[float, float, float], seed: int) -> Tensor:
    """One random permutation: the first round(N*train) nodes train, the next round(N*test) test, the rest val."""
    rng = np.random.default_rng([seed, 0])
    order = torch.from_numpy(rng.permutation(num_nodes))
    n_train = round(num_nodes * fractions[0])
    n_test = round(num_nodes * fractions[2])
    split = torch.full((num_nodes,), VAL, dtype=torch.int8)
    split[order[:n_train]] = TRAIN
    split[order[n_train : n_train + n_test]] = TEST
    return split


def metis_parts(edge_index: Tensor, num_nodes: int, parts: int, seed: int) -> Tensor:
    """METIS k-way membership of every node; `edge_index` must hold both directions of each edge."""
    if parts == 1:
        return torch.zeros(num_nodes, dtype=torch.long)
    row, col = edge_index
    keep = row != col
    row, col = row[keep], col[keep]
    order = torch.argsort(row * num_nodes + col)
    row, col = row[order], col[order]
    indptr = torch.zeros(num_nodes + 1, dtype=torch.long)
    indptr[1:] = torch.cumsum(torch.bincount(row, minlength=num_nodes), 0)
    adjacency = pymetis.CSRAdjacency(indptr.tolist(), col.tolist())
    result = pymetis.part_graph(parts, adjacency=adjacency, options=pymetis.Options(seed=seed))
    membership = torch.tensor(list(result.vertex_part), dtype=torch.long)
    sizes = torch.bincount(membership, minlength=parts)
    if (sizes == 0).any():
        raise UserError(f"METIS left {int((sizes == 0).sum())} of {parts} parts empty; use fewer clients")
    return membership


def louvain_communities(edge_index: Tensor, num_nodes: int, seed: int) -> list[list[int]]:
    """networkx's Louvain communities (resolution LOUVAIN_RESOLUTION, seeded), each sorted, in a fixed order.

    networkx is imported here: only this scheme needs it. Nodes enter in id order and edges in
    `edge_index` order, so one seed gives one result on one graph.
    """
    import networkx as nx

    g = nx.Graph()
    g.add_nodes_from(range(num_nodes))
    g.add_edges_from((u, v) for u, v in edge_index.t().tolist() if u != v)
    found = nx.community.louvain_communities(g, resolution=LOUVAIN_RESOLUTION, seed=seed)
    return sorted((sorted(c) for c in found), key=lambda c: (-len(c), c[0]))


def louvain_clients(communities: list[list[int]], num_nodes: int, clients: int) -> list[list[int]]:
    """Merge communities into `clients` clients by OpenFGL's rule (its `subgraph_fl_louvain`, our code).

    Capacity C = N // M and slack d = min(LOUVAIN_DELTA, C // 10) (OpenFGL's d is 20 nodes; on small
    graphs a tenth of C keeps it meaningful). A community of more than C - d nodes is cut into pieces
    of C - d nodes in id order. Pieces go, largest first, to the current client while it can take them
    without passing C + d nodes, else to the next client in turn that can; a client at C nodes or more
    takes no more; a piece no client can take goes to the smallest client. Communities are kept whole
    wherever the sizes allow. Raises UserError when C - d < 1 node, or a client is left empty.
    """
    capacity = num_nodes // clients
    delta = min(LOUVAIN_DELTA, capacity // 10)
    piece = capacity - delta
    if piece < 1:
        raise UserError(f"{num_nodes} nodes are too few for {clients} clients")
    # at least N / (C - d) >= M pieces: cutting makes any M up to about N / (1 + d) possible
    groups = [community[i : i + piece] for community in communities for i in range(0, len(community), piece)]
    groups.sort(key=lambda g: (-len(g), g[0]))
    owners: list[list[int]] = [[] for _ in range(clients)]
    active, at = list(range(clients)), 0
    for group in groups:
        while len(active) > 1 and len(owners[active[at]]) >= capacity:
            active.pop(at)
            at %= len(active)
        fits = [step for step in range(len(active)) if len(owners[active[(at + step) % len(active)]]) + len(group)
                <= capacity + delta]  # fmt: skip
        if fits:
            at = (at + fits[0]) % len(active)
        else:
            at = min(range(len(active)), key=lambda i: (len(owners[active[i]]), i))
        owners[active[at]].extend(group)
    if any(not owner for owner in owners):
        raise UserError(f"Louvain's communities of {num_nodes} nodes fill only {sum(map(bool, owners))} of "
                        f"{clients} clients; choose fewer clients")  # fmt: skip
    return [sorted(owner) for owner in owners]


def dirichlet_clients(labels: np.ndarray, clients: int, alpha: float, seed: int) -> list[np.ndarray]:
    """Label skew: each class's nodes, shuffled, cut over the clients by Dirichlet(α·1) proportions.

    As OpenFGL (and NIID-Bench before it): classes in label order, one draw per class; a client that
    already holds N/M nodes or more gets no share of later classes (proportions renormalised over the
    others; if the draw put all its mass on full clients, the draw is kept as it is); the whole draw is
    repeated while some client holds fewer than DIRICHLET_MIN_NODES nodes, at most DIRICHLET_DRAWS
    times, then UserError. One numpy generator seeded by (data seed, M, 2) makes every draw, a stream of
    its own (the split uses (seed, 0), the overlap halves (seed, M)).
    """
    rng = np.random.default_rng([seed, clients, 2])
    n = len(labels)
    for _ in range(DIRICHLET_DRAWS):
        owners: list[list[int]] = [[] for _ in range(clients)]
        for k in np.unique(labels):
            members = rng.permutation(np.flatnonzero(labels == k))
            proportions = rng.dirichlet(np.full(clients, alpha))
            open_ = np.array([len(o) < n / clients for o in owners])
            if (proportions * open_).sum() > 0:
                proportions = proportions * open_
            proportions = proportions / proportions.sum()
            cuts = (np.cumsum(proportions) * len(members)).astype(int)[:-1]
            for owner, share in zip(owners, np.split(members, cuts)):
                owner.extend(share.tolist())
        if min(map(len, owners)) >= DIRICHLET_MIN_NODES:
            return [np.sort(np.array(o, dtype=np.int64)) for o in owners]
    raise UserError(f"dirichlet alpha={alpha}: in {DIRICHLET_DRAWS} draws some client of {clients} held fewer than "
                    f"{DIRICHLET_MIN_NODES} nodes; choose a larger alpha or fewer clients")  # fmt: skip


def make_partition(
    graph: Data, scheme: str, num_clients: int, data_seed: int, fractions: tuple[float, float, float]
) -> Partition:
    """Split the nodes, then partition them by `scheme` (a label) into `num_clients` clients."""
    check_clients(scheme, num_clients)
    check_data_seed(data_seed)
    if scheme.startswith(FILE_PREFIX):
        raise UserError(f"{scheme} is read from its split manifest, not made (cached_partition reads it)")
    n = graph.num_nodes
    split = split_nodes(n, fractions, data_seed)
    base = scheme.partition("-")[0]
    if scheme == "metis":
        membership = metis_parts(graph.edge_index, n, num_clients, data_seed)
        clients = tuple((membership == m).nonzero().view(-1) for m in range(num_clients))
    elif scheme == "overlap":
        parts = num_clients // CLIENTS_PER_PART
        membership = metis_parts(graph.edge_index, n, parts, data_seed)
        rng = np.random.default_rng([data_seed, num_clients])
        clients_list = []
        for p in range(parts):
            nodes = (membership == p).nonzero().view(-1).numpy()
            for _ in range(CLIENTS_PER_PART):
                half = rng.choice(nodes, size=len(nodes) // 2, replace=False)
                clients_list.append(torch.from_numpy(np.sort(half)))
        clients = tuple(clients_list)
    elif scheme == "louvain":
        merged = louvain_clients(louvain_communities(graph.edge_index, n, data_seed), n, num_clients)
        clients = tuple(torch.tensor(nodes, dtype=torch.long) for nodes in merged)
    else:
        assert base in ALPHA_SCHEMES, scheme  # check_clients admitted no other label
        drawn = dirichlet_clients(graph.y.numpy(), num_clients, scheme_alpha(scheme), data_seed)  # type: ignore[arg-type]
        clients = tuple(torch.from_numpy(nodes) for nodes in drawn)
    if any(c.numel() == 0 for c in clients):
        raise UserError(f"{graph.num_nodes} nodes are too few for {num_clients} clients")
    return Partition(scheme, data_seed, split, clients)


def graph_fingerprint(graph: Data) -> str:
    """Hash of the global graph, so a cached partition is never reused for changed preprocessing."""
    h = hashlib.sha256(graph.edge_index.numpy().tobytes())
    h.update(np.int64(graph.num_nodes).tobytes())
    h.update(graph.y.numpy().astype(np.int64).tobytes())
    return h.hexdigest()[:16]


def check_data_seed(data_seed: int) -> None:
    """Reject a data seed the split and METIS cannot both take, before any work is done.

    NumPy's generators take non-negative seeds only, and METIS keeps the low 32 bits of its seed
    (2**32 + 5 partitions like 5), so 0 .. 2**32 - 1 are the seeds that each give their own partition.
    """
    if not 0 <= data_seed <= MAX_DATA_SEED:
        raise UserError(f"--data-seed must be between 0 and {MAX_DATA_SEED} (the data seed of the split and "
                        f"METIS), got {data_seed}")  # fmt: skip


def cached_partition(
    graph: Data,
    dataset: str,
    scheme: str,
    num_clients: int,
    data_seed: int,
    fractions: tuple[float, float, float],
    cache_dir: Path | None,
) -> Partition:
    """`make_partition`, kept on disk keyed by dataset, scheme, client count, data seed and graph hash.

    A cache file is trusted for nothing its name says: its header carries the setting it was made for
    (dataset, graph fingerprint, scheme, client count, data seed, split fractions), and its content a
    digest. A file whose header differs from the requested setting (copied or renamed from another), or
    whose content does not match its header or its digest (a damaged disk, a hand edit, a file from
    before the header existed) is rebuilt and written over, never used; `--verbose` says so. Partial
    files that killed processes left behind are removed. A cache folder that cannot be written is one
    UserError naming it.
    """
    check_data_seed(data_seed)
    if scheme.startswith(FILE_PREFIX):
        from gflbench.data.manifest import manifest_partition  # it imports this module

        return manifest_partition(graph, dataset, scheme, num_clients, cache_dir)
    if cache_dir is None:
        return make_partition(graph, scheme, num_clients, data_seed, fractions)
    fingerprint = graph_fingerprint(graph)
    identity = {
        "dataset": dataset, "graph": fingerprint, "scheme": scheme, "clients": num_clients, "data_seed": data_seed,
        "fractions": list(fractions), **scheme_setting(scheme),
    }  # fmt: skip
    path = Path(cache_dir) / dataset / f"{scheme}-M{num_clients}-seed{data_seed}-{fingerprint}.pt"
    remove_stale_partials(path.parent)
    if path.exists():
        cached, problem = _load_cached(path, identity, graph.num_nodes)
        if cached is not None:
            return cached
        say_verbose(f"partition cache {path}: {problem}; rebuilt")
    partition = make_partition(graph, scheme, num_clients, data_seed, fractions)
    payload = {
        "identity": identity, "split": partition.split, "client_nodes": list(partition.client_nodes),
        "digest": partition.digest(),
    }  # fmt: skip
    partial = partial_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(payload, partial)
        os.replace(partial, path)  # atomic: a killed run never leaves a truncated cache file
    except OSError as error:
        raise UserError(
            f"cannot write the partition cache {Path(cache_dir) / dataset}: {error.strerror or error}; "
            f"set {DATA_DIR_ENV} or --data-dir to a writable folder"
        ) from None
    return partition


def scheme_setting(scheme: str) -> dict[str, Any]:
    """The constants of a new scheme that its cache file must have been made with (the paper's two
    schemes have none, so their existing cache files stay valid)."""
    if scheme == "louvain":
        return {"setting": {"louvain_resolution": LOUVAIN_RESOLUTION, "louvain_delta": LOUVAIN_DELTA}}
    if scheme.partition("-")[0] in ALPHA_SCHEMES:
        return {"setting": {"alpha": scheme_alpha(scheme), "min_nodes": DIRICHLET_MIN_NODES, "draws": DIRICHLET_DRAWS}}
    return {}


def _load_cached(path: Path, identity: dict[str, Any], num_nodes: int) -> tuple[Partition | None, str]:
    """The cached partition if the file is the one of `identity` and intact; else None and what is wrong."""
    try:
        stored = torch.load(path)
        split, nodes = stored["split"], tuple(stored["client_nodes"])
        claimed = stored.get("identity")
    except Exception as error:
        return None, f"does not load ({type(error).__name__})"
    if claimed is None:
        return None, "has no setting in its header (written by an older gflbench)"
    if claimed != identity:
        differ = ", ".join(f"{key} {claimed.get(key)!r} (not {value!r})" for key, value in identity.items()
                           if claimed.get(key) != value)  # fmt: skip
        return None, f"was made for another setting: {differ}"
    shapes_fit = (
        isinstance(split, Tensor) and split.dtype == torch.int8 and split.shape == (num_nodes,)
        and len(nodes) == identity["clients"]
        and all(isinstance(n, Tensor) and n.dtype == torch.long and n.dim() == 1 for n in nodes)
        and all(n.numel() == 0 or (int(n.min()) >= 0 and int(n.max()) < num_nodes) for n in nodes)
    )  # fmt: skip
    if not shapes_fit:
        return None, f"does not hold a split of {num_nodes} nodes over {identity['clients']} clients"
    partition = Partition(identity["scheme"], identity["data_seed"], split, nodes)
    if partition.digest() != stored.get("digest"):
        return None, "content does not match its digest"
    return partition, ""


def client_graphs(graph: Data, partition: Partition) -> list[Data]:
    """Each client's induced subgraph with its slice of the global split and its global node ids."""
    graphs = []
    for nodes in partition.client_nodes:
        edge_index, _ = subgraph(nodes, graph.edge_index, relabel_nodes=True, num_nodes=graph.num_nodes)
        split = partition.split[nodes]
        graphs.append(
            Data(
                x=graph.x[nodes],
                y=graph.y[nodes],
                edge_index=edge_index,
                train_mask=split == TRAIN,
                val_mask=split == VAL,
                test_mask=split == TEST,
                global_id=nodes,
            )
        )
    return graphs
