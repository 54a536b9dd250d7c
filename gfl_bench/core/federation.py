"""A federation: one dataset split over clients, the client graphs on the host and prepared per backbone on a
device; loaded once per process (`DataCache`) and checked for measurability before any run."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch_geometric.data import Data

from gflbench.backbones import backbone_class, prepared_key
from gflbench.core.method import MethodParams
from gflbench.core.metrics import defined_on
from gflbench.data import data_fingerprint, dataset_spec, load_dataset
from gflbench.data.partition import Partition, cached_partition, client_graphs
from gflbench.errors import UserError


@dataclass
class FederatedData:
    """One dataset split over clients: the CPU graphs, and device copies prepared per backbone."""

    dataset: str
    metric: str
    num_features: int
    num_classes: int
    partition: Partition
    graphs: list[Data]
    prepared: dict[tuple[Any, ...], list[Data]] = field(default_factory=dict)
    data_fingerprint: str | None = None  # datasets.data_fingerprint of the preprocessed global graph

    def on_device(self, params: MethodParams, device: torch.device) -> list[Data]:
        """Client graphs with the operators of the backbone `params` names, on `device`; computed once
        per (backbone, its options, device), then shared.

        Each run gets shallow copies, so a method may replace attributes of its graphs (a mended
        or expanded graph) without touching other runs; tensors must not be changed in place.
        """
        key = (*prepared_key(params), str(device))
        if key not in self.prepared:
            prepared = []
            for graph in self.graphs:
                g = copy.copy(graph)
                backbone_class(params.backbone).prepare(g, params)
                prepared.append(g.to(device))
            self.prepared[key] = prepared
        return [copy.copy(g) for g in self.prepared[key]]


class DataCache:
    """Loads each dataset and partition once per process: a grid reuses them across methods and seeds."""

    def __init__(self, data_dir: Path | None, partition_dir: Path | None) -> None:
        self.data_dir = data_dir
        self.partition_dir = partition_dir
        self._graphs: dict[tuple[str, str | None], Data] = {}
        self._federated: dict[tuple[str, str, int, int, str | None], FederatedData] = {}

    def graph(self, dataset: str, feature_norm: str | None = None) -> Data:
        """The global graph, its features as `feature_norm` asks (None: the dataset's own preprocessing)."""
        if (dataset, feature_norm) not in self._graphs:
            self._graphs[dataset, feature_norm] = load_dataset(dataset, self.data_dir, feature_norm)
        return self._graphs[dataset, feature_norm]

    def federated(
        self, dataset: str, scheme: str, clients: int, data_seed: int, feature_norm: str | None = None
    ) -> FederatedData:
        """The federation of one setting. The partition is always computed on the dataset's own graph: features
        never enter it, so a run on unnormalised features has the same clients and splits (and partition hash) as one
        on the default preprocessing, and only the client graphs' x differ."""
        key = (dataset, scheme, clients, data_seed, feature_norm)
        if key not in self._federated:
            spec = dataset_spec(dataset)
            graph = self.graph(dataset, feature_norm)
            partition = cached_partition(
                self.graph(dataset), dataset, scheme, clients, data_seed, spec.split, self.partition_dir
            )
            self._federated[key] = FederatedData(
                dataset=dataset,
                metric=spec.metric,
                num_features=graph.num_features,
                num_classes=int(graph.y.max()) + 1,
                partition=partition,
                graphs=client_graphs(graph, partition),
                data_fingerprint=data_fingerprint(graph),
            )
        return self._federated[key]


def check_measurable(data: FederatedData) -> None:
    """Refuse, before any run, a setting whose validation or test metric no client has: a client
    without the nodes a metric needs is left out of that split's client mean (`excluded_clients` in the
    record), but with none left the run would have no value to report or select by."""
    setting = f"{data.dataset} {data.partition.scheme}-{data.partition.num_clients}"
    need = "nodes of both classes" if data.metric == "roc_auc" else "nodes"
    for split in ("val", "test"):
        if not any(defined_on(data.metric, g.y[getattr(g, f"{split}_mask")]) for g in data.graphs):
            raise UserError(f"{setting}: no client has {split} {need}, so {data.metric} cannot be measured; "
                            "choose fewer clients")  # fmt: skip
