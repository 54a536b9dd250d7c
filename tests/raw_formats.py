"""Small raw files in the exact upstream formats that PyG and OGB read, for datasets we cannot download here.

Each writer stores one `SmallGraph` under a root folder in PyG's raw layout and returns the paths it wrote
(relative to the root), so tests can drive the real loaders end to end and know the expected result:
the graph has one large component plus a small extra one, so the largest-connected-component step shows.
Edges are written in one direction only, so the loaders' undirected step shows too.
"""

from __future__ import annotations

import gzip
import os
import pickle
import struct
import zipfile
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

REPO = Path(__file__).resolve().parent.parent


def real_mirror() -> Path:
    """The folder of real raw files: GFLBENCH_RAW_MIRROR (CI sets ../shared/data), else ../shared/data."""
    return Path(os.environ.get("GFLBENCH_RAW_MIRROR") or REPO.parent / "shared" / "data").expanduser().resolve()


@dataclass(frozen=True)
class SmallGraph:
    """A graph whose largest component, labels and features are known in advance."""

    x: np.ndarray  # [N, F] float32
    y: np.ndarray  # [N] int64, every class occurs in the largest component
    edges: np.ndarray  # [E, 2] int64, each undirected edge once, no self-loops
    lcc: np.ndarray  # [N] bool, the largest connected component
    num_classes: int


def small_graph(
    num_nodes: int = 40,
    num_classes: int = 3,
    num_features: int = 6,
    extra_nodes: int = 3,
    binary_features: bool = True,
    seed: int = 0,
) -> SmallGraph:
    """A random tree plus chords on the main nodes, and a path on `extra_nodes` others, ids shuffled.

    Binary features (bag-of-words like Planetoid/Amazon) have one all-zero row in the main component so
    that row normalisation must leave empty rows alone; float features include negatives.
    """
    rng = np.random.default_rng(seed)
    main = num_nodes - extra_nodes
    tree = [(i, int(rng.integers(0, i))) for i in range(1, main)]
    chords = {tuple(sorted(map(int, rng.choice(main, 2, replace=False)))) for _ in range(main // 2)}
    path = [(i, i + 1) for i in range(main, num_nodes - 1)]
    edges = set(tree) | chords | set(path)
    edges = {(a, b) for a, b in edges if (b, a) not in edges or a < b}  # each undirected edge once
    perm = rng.permutation(num_nodes)  # node i of the construction gets id perm[i]
    edge_array = perm[np.array(sorted(edges), dtype=np.int64)]
    y = np.empty(num_nodes, dtype=np.int64)
    y[perm] = np.arange(num_nodes) % num_classes
    lcc = np.zeros(num_nodes, dtype=bool)
    lcc[perm[:main]] = True
    if binary_features:
        x = (rng.random((num_nodes, num_features)) < 0.4).astype(np.float32)
        x[perm[0]] = 0.0
    else:
        x = rng.normal(size=(num_nodes, num_features)).astype(np.float32)
    return SmallGraph(x, y, edge_array, lcc, num_classes)


def write_planetoid(root: Path, folder: str, graph: SmallGraph, num_train: int = 20) -> list[Path]:
    """`<folder>/raw/ind.<folder.lower()>.*` as in kimiyoung/planetoid: pickles plus a text test index.

    PyG takes the 500 nodes after the training nodes as validation, so the graph needs more than
    `num_train + 500` nodes; the last nodes are the test nodes, listed in shuffled order as upstream.
    """
    n = graph.x.shape[0]
    if n <= num_train + 500:
        raise ValueError(f"Planetoid needs more than {num_train + 500} nodes, got {n}")
    num_all = n - max(10, n // 20)
    test_index = np.random.default_rng(1).permutation(np.arange(num_all, n))
    one_hot = np.eye(graph.num_classes, dtype=np.int32)[graph.y]
    adjacency: defaultdict[int, list[int]] = defaultdict(list, {node: [] for node in range(n)})  # all nodes keyed
    for a, b in graph.edges.tolist():
        adjacency[a].append(b)
    prefix = f"ind.{folder.lower()}"
    objects = {
        "x": sp.csr_matrix(graph.x[:num_train]),
        "tx": sp.csr_matrix(graph.x[test_index]),
        "allx": sp.csr_matrix(graph.x[:num_all]),
        "y": one_hot[:num_train],
        "ty": one_hot[test_index],
        "ally": one_hot[:num_all],
        "graph": adjacency,
    }
    raw = Path(root) / folder / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for name, obj in objects.items():
        with open(raw / f"{prefix}.{name}", "wb") as f:
            pickle.dump(obj, f)
    (raw / f"{prefix}.test.index").write_text("".join(f"{i}\n" for i in test_index))
    return sorted(p.relative_to(root) for p in raw.iterdir())


def write_amazon(root: Path, which: str, graph: SmallGraph) -> list[Path]:
    """`<Which>/raw/amazon_electronics_<which>.npz` in the shchur/gnn-benchmark CSR layout."""
    n, f = graph.x.shape
    adj = sp.csr_matrix(
        (np.ones(len(graph.edges), dtype=np.float32), (graph.edges[:, 0], graph.edges[:, 1])), shape=(n, n)
    )
    attr = sp.csr_matrix(graph.x)
    rel = Path(which.capitalize()) / "raw" / f"amazon_electronics_{which.lower()}.npz"
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    np.savez(
        root / rel,
        adj_data=adj.data.astype(np.float32),
        adj_indices=adj.indices.astype(np.int32),
        adj_indptr=adj.indptr.astype(np.int32),
        adj_shape=np.array([n, n], dtype=np.int64),
        attr_data=attr.data.astype(np.float32),
        attr_indices=attr.indices.astype(np.int32),
        attr_indptr=attr.indptr.astype(np.int32),
        attr_shape=np.array([n, f], dtype=np.int64),
        labels=graph.y,
        class_names=np.array([f"class {c}" for c in range(graph.num_classes)]),
    )
    return [rel]


def write_heterophilous(root: Path, name: str, graph: SmallGraph) -> list[Path]:
    """`<name_>/raw/<name_>.npz` as in yandex-research/heterophilous-graphs, with its 10 random splits."""
    folder = name.replace("-", "_")
    n = graph.x.shape[0]
    rng = np.random.default_rng(2)
    part = np.stack([rng.permutation(n) % 4 for _ in range(10)])  # 50% train, 25% val, 25% test
    rel = Path(folder) / "raw" / f"{folder}.npz"
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    np.savez(
        root / rel,
        node_features=graph.x,
        node_labels=graph.y,
        edges=graph.edges,
        train_masks=part < 2,
        val_masks=part == 2,
        test_masks=part == 3,
    )
    return [rel]


def _write_csv_gz(path: Path, rows: np.ndarray, fmt: str) -> None:
    """One row per line, comma-separated, no header: how OGB ships its csv.gz files."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        np.savetxt(f, rows.reshape(len(rows), -1), fmt=fmt, delimiter=",")


def write_ogbn_arxiv(root: Path, graph: SmallGraph) -> list[Path]:
    """`ogbn_arxiv/` as unpacked from OGB's arxiv.zip: release marker, raw csv.gz files, time split."""
    n = graph.x.shape[0]
    base = Path("ogbn_arxiv")
    order = np.random.default_rng(3).permutation(n)
    files: dict[str, tuple[np.ndarray, str]] = {
        "raw/edge.csv.gz": (graph.edges, "%d"),  # directed citations, src,dst
        "raw/node-feat.csv.gz": (graph.x, "%.6f"),
        "raw/node-label.csv.gz": (graph.y, "%d"),
        "raw/node_year.csv.gz": (2000 + np.arange(n) % 20, "%d"),
        "raw/num-node-list.csv.gz": (np.array([n]), "%d"),
        "raw/num-edge-list.csv.gz": (np.array([len(graph.edges)]), "%d"),
        "split/time/train.csv.gz": (np.sort(order[: n // 2]), "%d"),
        "split/time/valid.csv.gz": (np.sort(order[n // 2 : 3 * n // 4]), "%d"),
        "split/time/test.csv.gz": (np.sort(order[3 * n // 4 :]), "%d"),
    }
    for rel, (rows, fmt) in files.items():
        _write_csv_gz(root / base / rel, rows, fmt)
    (root / base / "RELEASE_v1.txt").write_text("# Release note for ogbn-arxiv\n\n### v1: Initial release.\n")
    return sorted([base / "RELEASE_v1.txt", *(base / rel for rel in files)])


def _planetoid(folder: str) -> Callable[[Path], tuple[SmallGraph, list[Path]]]:
    def write(root: Path) -> tuple[SmallGraph, list[Path]]:
        graph = small_graph(num_nodes=560, num_classes=4, num_features=12, seed=len(folder))
        return graph, write_planetoid(root, folder, graph)

    return write


def _amazon(which: str) -> Callable[[Path], tuple[SmallGraph, list[Path]]]:
    def write(root: Path) -> tuple[SmallGraph, list[Path]]:
        graph = small_graph(num_nodes=45, num_classes=5, num_features=8, seed=len(which))
        return graph, write_amazon(root, which, graph)

    return write


def _heterophilous(name: str, num_classes: int) -> Callable[[Path], tuple[SmallGraph, list[Path]]]:
    def write(root: Path) -> tuple[SmallGraph, list[Path]]:
        graph = small_graph(num_nodes=36, num_classes=num_classes, binary_features=False, seed=len(name))
        return graph, write_heterophilous(root, name, graph)

    return write


def _ogbn_arxiv(root: Path) -> tuple[SmallGraph, list[Path]]:
    graph = small_graph(num_nodes=50, num_classes=4, num_features=5, binary_features=False, seed=7)
    return graph, write_ogbn_arxiv(root, graph)


# Benchmark name -> writer of a small stand-in for its raw files (the binary-label sets keep 2 classes).
WRITERS: dict[str, Callable[[Path], tuple[SmallGraph, list[Path]]]] = {
    "cora": _planetoid("Cora"),
    "citeseer": _planetoid("CiteSeer"),
    "pubmed": _planetoid("PubMed"),
    "amazon-computer": _amazon("computers"),
    "amazon-photo": _amazon("photo"),
    "ogbn-arxiv": _ogbn_arxiv,
    "roman-empire": _heterophilous("roman-empire", 5),
    "amazon-ratings": _heterophilous("amazon-ratings", 5),
    "minesweeper": _heterophilous("minesweeper", 2),
    "tolokers": _heterophilous("tolokers", 2),
    "questions": _heterophilous("questions", 2),
}


def overwrite_tensor_bytes(path: Path, size: int, data: bytes) -> None:
    """Overwrite the start of the one tensor storage of `size` bytes inside a torch (zip) file in place.

    The zip entry's CRC goes stale, which torch's reader does not check: the file still loads, with other
    numbers, as a disk error or a hand edit leaves it."""
    with zipfile.ZipFile(path) as archive:
        (entry,) = [info for info in archive.infolist() if info.file_size == size and "/data/" in info.filename]
    with open(path, "r+b") as file:
        file.seek(entry.header_offset + 26)  # local file header: name and extra-field lengths
        name_length, extra_length = struct.unpack("<HH", file.read(4))
        file.seek(entry.header_offset + 30 + name_length + extra_length)
        file.write(data)
