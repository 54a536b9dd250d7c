"""Table 3, from the data rather than the store: each graph's statistics, and how heterogeneous its partitions are."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from gflbench.data import DATASETS, is_available, load_dataset
from gflbench.paper.tables.blocks import Block, frame_of


def dataset_table(data_dir: Path) -> list[Block]:
    """Table 3 from the data: nodes, undirected edges, classes, features and metric, after preprocessing."""
    text, values = {}, {}
    columns = [("", "# Nodes"), ("", "# Edges"), ("", "# Classes"), ("", "# Features"), ("", "Metric"), ("", "Status")]
    for name, spec in DATASETS.items():
        if spec.synthetic:
            continue
        if is_available(name, data_dir):
            g = load_dataset(name, data_dir)
            stats = [g.num_nodes, g.num_edges // 2, int(g.y.max()) + 1, g.num_features]
            text[spec.title] = [f"{v:,}" for v in stats] + [spec.metric, "loaded"]
        else:
            stats = [math.nan] * 4
            text[spec.title] = [""] * 4 + [spec.metric, "absent"]
        values[spec.title] = [*stats, math.nan, math.nan]
    frame = frame_of(text, columns)
    frame.index.name = "Dataset"
    return [Block(frame, frame_of(values, columns), higher_is_better=None)]


def partition_table(data_dir: Path, scheme: str, counts: Sequence[int], data_seed: int) -> Block:
    """Table 3's second part (issue 32, item 5): how heterogeneous each loaded graph's `scheme` partition is at
    each client count, as `heterogeneity.setting_summary` puts a partition in one row (client means), so that
    a scheme's heterogeneity sits beside the graphs it splits. Partitions are made and cached as runs make them."""
    from gflbench.core.federation import DataCache
    from gflbench.data.heterogeneity import SETTING_COLUMNS, setting_summary

    cache = DataCache(data_dir, data_dir / "partitions")
    names = ("JS div.", "Quantity imbalance", "Homophily", "Client homophily", "Gap", "Missing")
    columns = [("", name) for name in names]
    text, values = {}, {}
    for name, spec in DATASETS.items():
        if spec.synthetic or not is_available(name, data_dir):
            continue
        for clients in counts:
            data = cache.federated(name, scheme, clients, data_seed)
            summary = setting_summary(cache.graph(name), data.graphs)
            row = [summary[column] for column in SETTING_COLUMNS]
            label = f"{spec.title}, {clients} clients"
            text[label] = [f"{v:+.3f}" if c == "Gap" else f"{v:.3f}" for c, v in zip(names, row)]
            values[label] = row
    frame = frame_of(text, columns)
    frame.index.name = "Partition"
    return Block(frame, frame_of(values, columns), higher_is_better=None, verbatim=True)
