"""The eleven benchmark graphs (and `tiny`), loaded through PyG's and OGB's own dataset classes.

Preprocessing follows the FED-PUB/FedIIH protocol the paper builds on (docs/protocol.md):
undirected, largest connected component, row-normalised features for Planetoid and Amazon.
Raw files come from PyG's download, or from an offline mirror in PyG's raw layout
(`GFLBENCH_RAW_MIRROR`) that is copied into the writable data directory first, because PyG writes
`processed/` next to `raw/`.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from torch_geometric.data import Data
from torch_geometric.transforms import Compose, LargestConnectedComponents, NormalizeFeatures, ToUndirected

from gfl_bench.errors import UserError

DATA_DIR_ENV = "GFLBENCH_DATA"
RAW_MIRROR_ENV = "GFLBENCH_RAW_MIRROR"


@dataclass(frozen=True)
class DatasetSpec:
    """What the protocol fixes for one dataset: where its raw files live, how it is split and trained."""

    name: str  # CLI name
    title: str  # name in the paper's tables
    folder: str  # folder under the data directory, as PyG/OGB name it
    raw_files: tuple[str, ...]  # paths relative to `folder` that must exist before loading offline
    metric: str  # "accuracy" or "roc_auc"
    rounds: int
    local_epochs: int
    split: tuple[float, float, float] = (0.2, 0.4, 0.4)  # train, val, test fractions
    homophilic: bool = True
    normalize_features: bool = True
    synthetic: bool = False  # generated (tiny, the arxiv-sized graph): in no paper table


_PLANETOID_RAW = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
_OGB_ARXIV_RAW = (
    "RELEASE_v1.txt",
    "raw/edge.csv.gz",
    "raw/node-feat.csv.gz",
    "raw/node-label.csv.gz",
    "raw/node_year.csv.gz",
    "raw/num-node-list.csv.gz",
    "raw/num-edge-list.csv.gz",
    "split/time/train.csv.gz",
    "split/time/valid.csv.gz",
    "split/time/test.csv.gz",
)


def _planetoid(name: str, title: str, folder: str) -> DatasetSpec:
    return DatasetSpec(
        name, title, folder, tuple(f"raw/ind.{folder.lower()}.{s}" for s in _PLANETOID_RAW), "accuracy", 100, 1
    )


def _heterophilous(name: str, title: str, metric: str) -> DatasetSpec:
    folder = name.replace("-", "_")
    return DatasetSpec(
        name, title, folder, (f"raw/{folder}.npz",), metric, 100, 1, homophilic=False, normalize_features=False
    )


DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        _planetoid("cora", "Cora", "Cora"),
        _planetoid("citeseer", "CiteSeer", "CiteSeer"),
        _planetoid("pubmed", "PubMed", "PubMed"),
        DatasetSpec(
            "amazon-computer", "Amazon-Computer", "Computers",
            ("raw/amazon_electronics_computers.npz",), "accuracy", 200, 3,
        ),
        DatasetSpec(
            "amazon-photo", "Amazon-Photo", "Photo", ("raw/amazon_electronics_photo.npz",), "accuracy", 200, 2
        ),
        DatasetSpec(
            "ogbn-arxiv", "ogbn-arxiv", "ogbn_arxiv", _OGB_ARXIV_RAW, "accuracy", 200, 2,
            split=(0.05, 0.475, 0.475), normalize_features=False,
        ),
        _heterophilous("roman-empire", "Roman-empire", "accuracy"),
        _heterophilous("amazon-ratings", "Amazon-ratings", "accuracy"),
        _heterophilous("minesweeper", "Minesweeper", "roc_auc"),
        _heterophilous("tolokers", "Tolokers", "roc_auc"),
        _heterophilous("questions", "Questions", "roc_auc"),
        DatasetSpec("tiny", "Tiny", "tiny", (), "accuracy", 100, 1, normalize_features=False, synthetic=True),
        # ogbn-arxiv's size (169,343 nodes, ~1.17 M edges, 128 features, 40 classes), generated: for cost
        # measurements only; its name and title say it is synthetic, and no paper table lists it.
        DatasetSpec("synthetic-arxiv-size", "Synthetic (arxiv-sized)", "synthetic", (), "accuracy", 200, 2,
                    split=(0.05, 0.475, 0.475), normalize_features=False, synthetic=True),  # fmt: skip
    )
}


def dataset_spec(name: str) -> DatasetSpec:
    try:
        return DATASETS[name]
    except KeyError:
        raise UserError(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}") from None


def default_data_dir() -> Path:
    """`GFLBENCH_DATA`, else the user's cache folder: datasets are large and shared between checkouts."""
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "gflbench"


def missing_raw_files(spec: DatasetSpec, data_dir: Path) -> list[Path]:
    """Raw files the loader needs that are neither in the data directory nor loadable from the mirror."""
    _copy_from_mirror(spec, data_dir)
    return [data_dir / spec.folder / f for f in spec.raw_files if not (data_dir / spec.folder / f).exists()]


def is_available(name: str, data_dir: Path) -> bool:
    """True when the dataset can be loaded without a download."""
    spec = dataset_spec(name)
    return not spec.raw_files or not missing_raw_files(spec, data_dir)


def _copy_from_mirror(spec: DatasetSpec, data_dir: Path) -> None:
    """Copy the raw files of `spec` from the read-only mirror into the writable data directory.

    A cached copy whose size differs from the mirror's (a truncated copy, a mirror fixed since) is
    copied again, and the dataset's `processed/` folder, built from the old copy, is removed so PyG
    rebuilds it.
    """
    mirror = os.environ.get(RAW_MIRROR_ENV)
    if not mirror:
        return
    try:
        copied = False
        for rel in spec.raw_files:
            source = Path(mirror).expanduser() / spec.folder / rel
            target = data_dir / spec.folder / rel
            if not source.is_file() or (target.exists() and target.stat().st_size == source.stat().st_size):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(target.name + ".partial")
            shutil.copyfile(source, partial)  # copyfile: the mirror's read-only mode must not follow
            os.replace(partial, target)
            copied = True
        if copied:  # whatever was processed from the old copies is stale
            for processed in (data_dir / spec.folder).rglob("processed"):
                shutil.rmtree(processed, ignore_errors=True)
    except OSError as error:
        raise UserError(
            f"cannot copy {spec.name!r} into the data directory {data_dir}: {error.strerror or error}; "
            f"set {DATA_DIR_ENV} or --data-dir to a writable folder"
        ) from None


VERBOSE_ENV = "GFLBENCH_VERBOSE"  # set by `gflbench --verbose`; worker processes inherit it


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """Hide PyG's "Processing... Done!" and library warnings unless the user asked for --verbose.

    Errors still surface: they are exceptions, not prints.
    """
    if os.environ.get(VERBOSE_ENV):
        yield
        return
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def load_dataset(name: str, data_dir: Path | None = None) -> Data:
    """The preprocessed global graph of `name`: undirected, largest connected component, y of shape [N]."""
    spec = dataset_spec(name)
    if spec.name == "tiny":
        return tiny_graph()
    if spec.name == "synthetic-arxiv-size":
        return tiny_graph(num_nodes=169_343, num_classes=40, num_features=128, degree=6)
    data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
    missing = missing_raw_files(spec, data_dir)
    try:
        with quiet_libraries():
            raw = _LOADERS[spec.name](spec, data_dir)
    except UserError:
        raise
    except Exception as error:  # a failed download surfaces as many exception types
        if not missing:  # the files are there but do not parse: name them and say what to do
            raise UserError(
                f"dataset {name!r}: the files in {data_dir / spec.folder} could not be read ({type(error).__name__}: "
                f"{error}); a raw or processed file is truncated or corrupted: fix the mirror ({RAW_MIRROR_ENV}) or "
                f"delete {data_dir / spec.folder} to copy or download it again"
            ) from None
        shown = ", ".join(str(p) for p in missing[:3]) + (f" (+{len(missing) - 3} more)" if len(missing) > 3 else "")
        raise UserError(
            f"dataset {name!r} is not available offline and could not be downloaded ({type(error).__name__}); "
            f"missing {shown}; set {RAW_MIRROR_ENV} to a folder in PyG raw layout or {DATA_DIR_ENV} "
            f"to a data directory that holds it"
        ) from None
    return preprocess(raw, spec)


def preprocess(data: Data, spec: DatasetSpec) -> Data:
    """Keep x, y and edges only; make undirected, keep the largest component, row-normalise if asked."""
    graph = Data(x=data.x.float(), y=data.y.view(-1).long(), edge_index=data.edge_index)
    steps: list[Callable] = [ToUndirected(), LargestConnectedComponents()]
    if spec.normalize_features:
        steps.append(NormalizeFeatures())
    return Compose(steps)(graph)


def _load_planetoid(spec: DatasetSpec, data_dir: Path) -> Data:
    from torch_geometric.datasets import Planetoid

    return Planetoid(str(data_dir), spec.folder)[0]


def _load_amazon(spec: DatasetSpec, data_dir: Path) -> Data:
    from torch_geometric.datasets import Amazon

    return Amazon(str(data_dir), spec.folder)[0]


def _load_heterophilous(spec: DatasetSpec, data_dir: Path) -> Data:
    from torch_geometric.datasets import HeterophilousGraphDataset

    return HeterophilousGraphDataset(str(data_dir), spec.name)[0]


def _load_ogb(spec: DatasetSpec, data_dir: Path) -> Data:
    from ogb.nodeproppred import PygNodePropPredDataset

    folder = data_dir / spec.folder
    if folder.is_dir() and not (folder / "RELEASE_v1.txt").exists():
        # Without the release marker OGB asks on stdin whether to delete the folder. A failed download
        # leaves only empty folders behind: drop those, so a retry reports the missing files again.
        if any(p.is_file() for p in folder.rglob("*")):
            raise UserError(f"{folder} exists but has no RELEASE_v1.txt; remove the folder or complete it")
        shutil.rmtree(folder)
    with _ogb_processed_globals():
        return PygNodePropPredDataset(spec.name, root=str(data_dir))[0]


def _ogb_processed_globals() -> AbstractContextManager:
    """Allow the three PyG classes inside OGB's processed file, so torch>=2.6 can load it.

    OGB saves `InMemoryDataset.collate(...)` (a `Data` object) and reads it back with a bare
    `torch.load`, which now defaults to `weights_only=True`; PyG allowlists `Data` but not its storage
    and attribute classes. Naming just those (for this call only) keeps the weights-only protection
    instead of loading the file with `weights_only=False`. Before torch 2.5 there is nothing to allow.
    """
    if not hasattr(torch.serialization, "safe_globals"):
        return nullcontext()
    from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import GlobalStorage

    return torch.serialization.safe_globals([GlobalStorage, DataEdgeAttr, DataTensorAttr])


_LOADERS: dict[str, Callable[[DatasetSpec, Path], Data]] = {
    "cora": _load_planetoid,
    "citeseer": _load_planetoid,
    "pubmed": _load_planetoid,
    "amazon-computer": _load_amazon,
    "amazon-photo": _load_amazon,
    "ogbn-arxiv": _load_ogb,
    "roman-empire": _load_heterophilous,
    "amazon-ratings": _load_heterophilous,
    "minesweeper": _load_heterophilous,
    "tolokers": _load_heterophilous,
    "questions": _load_heterophilous,
}


def tiny_graph(
    num_nodes: int = 300, num_classes: int = 4, num_features: int = 16, seed: int = 0, degree: int = 4
) -> Data:
    """A deterministic stochastic-block graph with class-informative features: `tiny` for smoke tests,
    and at ogbn-arxiv's size `synthetic-arxiv-size` for cost measurements.

    Edges fall inside a class with probability 0.8 (homophily), features are a noisy one-hot of the
    class, so a GNN can learn it in a few rounds; a ring keeps the graph connected. `degree` edges
    leave each node before symmetrisation.
    """
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(num_nodes) % num_classes
    y = y[torch.randperm(num_nodes, generator=gen)]
    src = torch.arange(num_nodes).repeat_interleave(degree)
    same_class = torch.rand(src.numel(), generator=gen) < 0.8
    dst = torch.randint(0, num_nodes, (src.numel(),), generator=gen)
    for c in range(num_classes):  # redirect intra-class draws to a random member of the class
        members = (y == c).nonzero().view(-1)
        pick = same_class & (y[src] == c)
        dst[pick] = members[torch.randint(0, members.numel(), (int(pick.sum()),), generator=gen)]
    ring = torch.stack([torch.arange(num_nodes), (torch.arange(num_nodes) + 1) % num_nodes])
    edge_index = torch.cat([torch.stack([src, dst]), ring], dim=1)
    edge_index = edge_index[:, edge_index[0] != edge_index[1]]
    centers = torch.randn(num_classes, num_features, generator=gen)
    x = centers[y] + 1.5 * torch.randn(num_nodes, num_features, generator=gen)
    return preprocess(Data(x=x, y=y, edge_index=edge_index), DATASETS["tiny"])
