"""The eleven benchmark graphs (and the generated `tiny` and `synthetic-arxiv-size`): what the protocol fixes for
each, by name, and where their files live.

Plain values, no torch: the CLI reads names, titles and schedules from here at start (docs/architecture.md,
"Import cost").
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gflbench.errors import UserError

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

    @property
    def feature_norm(self) -> str:
        """The protocol's feature normalisation for this graph, one of FEATURE_NORMS."""
        return "row" if self.normalize_features else "none"


# A run's node features: row-normalised (`row`: L1 = 1, PyG's NormalizeFeatures; the FED-PUB protocol for Planetoid
# and Amazon) or as the dataset class reads them (`none`). A source that reads them unnormalised (FedTAD's code)
# sets `feature_norm=none` in its `paper` preset (docs/protocol.md, "Feature normalisation").
FEATURE_NORMS = ("row", "none")


def check_feature_norm(feature_norm: str) -> None:
    if feature_norm not in FEATURE_NORMS:
        raise UserError(f"feature_norm must be one of {', '.join(FEATURE_NORMS)}, got {feature_norm!r}")


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
            "amazon-computer",
            "Amazon-Computer",
            "Computers",
            ("raw/amazon_electronics_computers.npz",),
            "accuracy",
            200,
            3,
        ),
        DatasetSpec("amazon-photo", "Amazon-Photo", "Photo", ("raw/amazon_electronics_photo.npz",), "accuracy", 200, 2),
        DatasetSpec(
            "ogbn-arxiv",
            "ogbn-arxiv",
            "ogbn_arxiv",
            _OGB_ARXIV_RAW,
            "accuracy",
            200,
            2,
            split=(0.05, 0.475, 0.475),
            normalize_features=False,
        ),
        _heterophilous("roman-empire", "Roman-empire", "accuracy"),
        _heterophilous("amazon-ratings", "Amazon-ratings", "accuracy"),
        _heterophilous("minesweeper", "Minesweeper", "roc_auc"),
        _heterophilous("tolokers", "Tolokers", "roc_auc"),
        _heterophilous("questions", "Questions", "roc_auc"),
        DatasetSpec("tiny", "Tiny", "tiny", (), "accuracy", 100, 1, normalize_features=False, synthetic=True),
        # ogbn-arxiv's size (169,343 nodes, ~1.17 M edges, 128 features, 40 classes), generated: for cost
        # measurements only; its name and title say it is synthetic, and no paper table lists it.
        DatasetSpec(
            "synthetic-arxiv-size",
            "Synthetic (arxiv-sized)",
            "synthetic",
            (),
            "accuracy",
            200,
            2,
            split=(0.05, 0.475, 0.475),
            normalize_features=False,
            synthetic=True,
        ),
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
