"""Node split and client partitions (paper B.3-B.4, protocol §1.1).

The train/val/test split is drawn once over the whole graph, before partitioning, and each client
sees the slice of it that falls on its nodes. Non-overlapping: METIS into M parts, induced
subgraphs. Overlapping: METIS into M/5 parts, each shared by 5 clients that each hold a random half
of the part's nodes. Both are fixed by the data seed, independent of the run seed, and cached on disk.
"""

from __future__ import annotations

import hashlib
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

from gfl_bench.datasets import DATA_DIR_ENV, partial_path, remove_stale_partials, say_verbose
from gfl_bench.errors import UserError

SCHEMES: dict[str, tuple[int, ...]] = {"metis": (5, 10, 20), "overlap": (10, 30, 50)}
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


def check_scheme(scheme: str) -> None:
    if scheme not in SCHEMES:
        raise UserError(f"unknown partition scheme {scheme!r}; choose from {', '.join(SCHEMES)}")


def check_clients(scheme: str, num_clients: int) -> None:
    """Reject client counts the scheme cannot make, before any work is done."""
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


def make_partition(
    graph: Data, scheme: str, num_clients: int, data_seed: int, fractions: tuple[float, float, float]
) -> Partition:
    """Split the nodes, then partition them by `scheme` into `num_clients` clients."""
    check_clients(scheme, num_clients)
    check_data_seed(data_seed)
    n = graph.num_nodes
    split = split_nodes(n, fractions, data_seed)
    if scheme == "metis":
        membership = metis_parts(graph.edge_index, n, num_clients, data_seed)
        clients = tuple((membership == m).nonzero().view(-1) for m in range(num_clients))
    else:
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
    if cache_dir is None:
        return make_partition(graph, scheme, num_clients, data_seed, fractions)
    fingerprint = graph_fingerprint(graph)
    identity = {
        "dataset": dataset, "graph": fingerprint, "scheme": scheme, "clients": num_clients, "data_seed": data_seed,
        "fractions": list(fractions),
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


def _load_cached(path: Path, identity: dict[str, Any], num_nodes: int) -> tuple[Partition | None, str]:
    """The cached partition if the file is the one of `identity` and intact; else None and what is wrong."""
    try:
        stored = torch.load(path)
        split, nodes = stored["split"], tuple(stored["client_nodes"])
        claimed = stored.get("identity")
    except Exception as error:  # noqa: BLE001 - any damage (truncation, garbage, missing keys) means: rebuild
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
