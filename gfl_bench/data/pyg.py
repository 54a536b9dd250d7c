"""Each benchmark graph through PyG's or OGB's own dataset class, and the preprocessing every graph gets.

Preprocessing follows the FED-PUB/FedIIH protocol the paper builds on (docs/protocol.md): undirected, largest
connected component, row-normalised features for Planetoid and Amazon. torch and PyG are imported inside the
functions, so that importing this module stays cheap.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from gflbench.data.registry import DatasetSpec
from gflbench.errors import UserError

if TYPE_CHECKING:
    from torch_geometric.data import Data


def preprocess(data: Data, spec: DatasetSpec) -> Data:
    """Keep x, y and edges only; make undirected, keep the largest component, row-normalise if asked."""
    from torch_geometric.data import Data
    from torch_geometric.transforms import Compose, LargestConnectedComponents, NormalizeFeatures, ToUndirected

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
    import torch

    if not hasattr(torch.serialization, "safe_globals"):
        return nullcontext()
    from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import GlobalStorage

    return torch.serialization.safe_globals([GlobalStorage, DataEdgeAttr, DataTensorAttr])


LOADERS: dict[str, Callable[[DatasetSpec, Path], Data]] = {
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
