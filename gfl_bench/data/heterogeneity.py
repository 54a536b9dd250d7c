"""How heterogeneous a partition is, per client and summarised (issue 32, item 5).

The measures follow the per-partition metrics graph-FL heterogeneity benchmarks report (OpenFGL's
`analysis.py`, the fgl_heterogeneity_benchmark's definitions), each defined here and in
docs/protocol.md, "Heterogeneity of a partition":

- nodes, edges (undirected, inside the client's induced subgraph) and training labels (train nodes);
- `js`: Jensen-Shannon divergence, base 2 (so in [0, 1]), between the client's label distribution
  (all its nodes) and the global graph's. scipy's `jensenshannon` returns the distance, its square
  root; we report the divergence, its square;
- `homophily`: edge homophily of the client's subgraph (PyG's `homophily(method="edge")`: the share of
  edges joining nodes of one class; NaN for a client without edges), and `homophily_gap`, the client's
  minus the global graph's;
- `missing`: the share of the client's nodes' edges in the global graph whose other end is not in
  the client (cut by the partition: missing neighbours);
- quantity imbalance of the partition: the coefficient of variation (population std / mean) of the
  clients' node counts; 0 when every client has as many nodes.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from scipy.spatial.distance import jensenshannon
from torch_geometric.data import Data
from torch_geometric.utils import homophily

COLUMNS = ("nodes", "edges", "train_labels", "js", "homophily", "homophily_gap", "missing")
# One partition in one row (`setting_summary`): what Table 3 and the report show beside a setting.
SETTING_COLUMNS = ("js", "quantity_imbalance", "homophily", "client_homophily", "homophily_gap", "missing")


def label_distribution(labels: torch.Tensor, num_classes: int) -> np.ndarray:
    counts = torch.bincount(labels, minlength=num_classes).double().numpy()
    return counts / counts.sum()


def edge_homophily(edge_index: torch.Tensor, labels: torch.Tensor) -> float:
    return float(homophily(edge_index, labels, method="edge")) if edge_index.numel() else float("nan")


def client_statistics(graph: Data, clients: list[Data]) -> pd.DataFrame:
    """One row per client (index: client id) with COLUMNS; `clients` carry `global_id` (partition.client_graphs)."""
    num_classes = int(graph.y.max()) + 1
    overall = label_distribution(graph.y, num_classes)
    global_h = edge_homophily(graph.edge_index, graph.y)
    source, target = graph.edge_index
    rows = []
    for client in clients:
        inside = torch.zeros(graph.num_nodes, dtype=torch.bool)
        inside[client.global_id] = True
        own = inside[source]  # edges leaving the client's nodes in the global graph
        h = edge_homophily(client.edge_index, client.y)
        rows.append({
            "nodes": client.num_nodes, "edges": client.num_edges // 2, "train_labels": int(client.train_mask.sum()),
            "js": float(jensenshannon(label_distribution(client.y, num_classes), overall, base=2) ** 2),
            "homophily": h, "homophily_gap": h - global_h,
            "missing": float((own & ~inside[target]).sum() / own.sum()) if own.any() else float("nan"),
        })  # fmt: skip
    return pd.DataFrame(rows, columns=list(COLUMNS))


def quantity_imbalance(stats: pd.DataFrame) -> float:
    sizes = stats["nodes"].to_numpy(dtype=float)
    return float(sizes.std() / sizes.mean())


def summary(stats: pd.DataFrame) -> pd.DataFrame:
    """Mean, min and max of every column over the clients (NaN left out)."""
    return stats.agg(["mean", "min", "max"])


def setting_summary(graph: Data, clients: list[Data]) -> dict[str, float]:
    """A whole partition in one row, so that settings can be compared side by side: the client means of
    `js`, `homophily` (as `client_homophily`), `homophily_gap` and `missing` (NaN left out), the quantity
    imbalance, and the global graph's edge homophily (`homophily`), which the gap is measured from."""
    stats = client_statistics(graph, clients)
    means = stats.mean()
    return {
        "js": float(means["js"]),
        "quantity_imbalance": quantity_imbalance(stats),
        "homophily": edge_homophily(graph.edge_index, graph.y),
        "client_homophily": float(means["homophily"]),
        "homophily_gap": float(means["homophily_gap"]),
        "missing": float(means["missing"]),
    }
