"""Split manifests: a partition written out, so that anyone can run exactly it (issue 32, item 2).

A manifest is gzip-compressed JSON: the dataset's name, its graph fingerprint (`partition.graph_fingerprint`:
edges, node count and labels of the preprocessed graph, what a partition depends on), its data
fingerprint (`datasets.data_fingerprint`, for the reader: features too), the scheme and data seed it
was made with, and per client its train, val and test nodes (global ids, sorted); its `sha256` is the
SHA-256 of the canonical JSON (sorted keys, no spaces) of everything else. Nodes in no client (the
overlap scheme's) are not listed: they take part in no run.

`--partition-file FILE` checks the file (format, hash) and copies it into the partition cache as
`<data dir>/partitions/<dataset>/manifest-<sha16>.json.gz`; the run's scheme label is `file-<sha16>`
(the first 16 hex digits of the hash), so the manifest's hash is in the run key and worker processes
find the file by the label alone. When the partition is built, the file is checked again against
the loaded graph (dataset name, graph fingerprint, node ids, client count): a mismatch is one line
and exit 2 before any run. Details and why: docs/protocol.md, "Split manifests".
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data

from gflbench.data import data_fingerprint, partial_path
from gflbench.data.partition import FILE_PREFIX, TEST, TRAIN, VAL, Partition, graph_fingerprint
from gflbench.errors import UserError

FORMAT = "gflbench-split-manifest/1"
_SPLITS = (("train", TRAIN), ("val", VAL), ("test", TEST))


def _digest(content: dict[str, Any]) -> str:
    text = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def manifest_of(partition: Partition, dataset: str, graph: Data) -> dict[str, Any]:
    """The manifest of `partition` of `dataset`'s preprocessed `graph`, with its sha256."""
    clients = []
    for nodes in partition.client_nodes:
        codes = partition.split[nodes]
        clients.append({name: sorted(nodes[codes == code].tolist()) for name, code in _SPLITS})
    content = {
        "format": FORMAT, "dataset": dataset, "num_nodes": graph.num_nodes, "graph": graph_fingerprint(graph),
        "data": data_fingerprint(graph), "scheme": partition.scheme, "data_seed": partition.data_seed,
        "clients": clients,
    }  # fmt: skip
    return {**content, "sha256": _digest(content)}


def write_manifest(manifest: dict[str, Any], path: Path) -> None:
    """Write gzip-compressed, byte-reproducible (no timestamp in the gzip header), atomically."""
    data = gzip.compress(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode(), mtime=0)
    partial = partial_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_bytes(data)
        os.replace(partial, path)
    except OSError as error:
        raise UserError(f"cannot write {path}: {error.strerror or error}") from None


def read_manifest(path: Path) -> dict[str, Any]:
    """A manifest file whose content matches its sha256; any other file is one UserError naming it."""
    try:
        manifest = json.loads(gzip.decompress(Path(path).read_bytes()))
    except FileNotFoundError:
        raise UserError(f"no partition file {path}") from None
    except (OSError, EOFError, ValueError) as error:
        raise UserError(f"{path} is not a gzip-compressed JSON split manifest ({type(error).__name__})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise UserError(f"{path} is not a split manifest of format {FORMAT}")
    content = {key: value for key, value in manifest.items() if key != "sha256"}
    if manifest.get("sha256") != _digest(content):
        raise UserError(f"{path}: its content does not match its sha256 (damaged or edited); export it again")
    return manifest


def label_of(manifest: dict[str, Any]) -> str:
    return FILE_PREFIX + manifest["sha256"][:16]


def register(path: Path, dataset: str, cache_dir: Path) -> tuple[str, int, int]:
    """Check `path` and copy it into the partition cache of `dataset`; its (label, client count, data seed)."""
    manifest = read_manifest(path)
    if manifest["dataset"] != dataset:
        raise UserError(f"{path} is a split of {manifest['dataset']}, not {dataset}")
    label = label_of(manifest)
    target = cached_path(cache_dir, dataset, label)
    if not target.exists():
        write_manifest(manifest, target)
    return label, len(manifest["clients"]), int(manifest["data_seed"])


def cached_path(cache_dir: Path, dataset: str, label: str) -> Path:
    return Path(cache_dir) / dataset / f"manifest-{label[len(FILE_PREFIX) :]}.json.gz"


def manifest_partition(graph: Data, dataset: str, label: str, num_clients: int, cache_dir: Path | None) -> Partition:
    """The partition of a registered manifest, checked against the loaded graph."""
    if cache_dir is None:
        raise UserError(f"the partition {label} is read from the partition cache, and there is none here")
    path = cached_path(cache_dir, dataset, label)
    if not path.exists():
        raise UserError(f"no split manifest {label} for {dataset} in {path.parent}; pass it with --partition-file")
    manifest = read_manifest(path)
    if label_of(manifest) != label or manifest["dataset"] != dataset:
        raise UserError(f"{path} holds {manifest['dataset']} {label_of(manifest)}, not {dataset} {label}")
    if manifest["num_nodes"] != graph.num_nodes or manifest["graph"] != graph_fingerprint(graph):
        raise UserError(f"{path} was made from another {dataset} graph ({manifest['num_nodes']} nodes, fingerprint "
                        f"{manifest['graph']}; this one: {graph.num_nodes}, {graph_fingerprint(graph)})")  # fmt: skip
    if len(manifest["clients"]) != num_clients:
        raise UserError(f"{path} has {len(manifest['clients'])} clients, not {num_clients}")
    split = np.full(graph.num_nodes, -1, dtype=np.int8)  # -1: in no client yet
    client_nodes = []
    for client in manifest["clients"]:
        parts = [np.asarray(client[name], dtype=np.int64) for name, _ in _SPLITS]
        nodes = np.concatenate(parts)
        if nodes.size == 0 or nodes.min() < 0 or nodes.max() >= graph.num_nodes or np.unique(nodes).size != nodes.size:
            raise UserError(f"{path}: a client's node ids are empty, repeated or outside 0..{graph.num_nodes - 1}")
        for (name, code), part in zip(_SPLITS, parts):
            if ((split[part] != -1) & (split[part] != code)).any():
                raise UserError(f"{path}: a node is {name} in one client and not in another")
            split[part] = code
        client_nodes.append(torch.from_numpy(np.sort(nodes)))
    split[split == -1] = VAL  # nodes in no client take part in no run
    return Partition(label, int(manifest["data_seed"]), torch.from_numpy(split), tuple(client_nodes))
