"""Per-client metrics computed on the device (no host round-trip inside the training loop)."""

from __future__ import annotations

import torch
from torch import Tensor


def accuracy(logits: Tensor, y: Tensor) -> Tensor:
    """Fraction of nodes whose arg-max class is the label; NaN for an empty set."""
    return (logits.argmax(dim=1) == y).float().mean()


def roc_auc(logits: Tensor, y: Tensor) -> Tensor:
    """Binary ROC-AUC of the class-1 probability, ties counted one half (Mann-Whitney U).

    NaN when the set lacks one of the two classes: AUC is undefined there, and the client is
    left out of the client mean for that split (docs/protocol.md).
    """
    score = torch.softmax(logits.double(), dim=1)[:, 1]
    positive = y == 1
    n_pos = positive.sum()
    n_neg = y.numel() - n_pos
    ranks = _average_ranks(score)
    u = ranks[positive].sum() - n_pos * (n_pos + 1) / 2
    return (u / (n_pos * n_neg)).float()  # 0/0 = NaN when a class is absent; no host sync needed


def _average_ranks(values: Tensor) -> Tensor:
    """1-based ranks with ties given the mean of the ranks they span."""
    sorted_values, order = torch.sort(values)
    _, inverse, counts = torch.unique_consecutive(sorted_values, return_inverse=True, return_counts=True)
    last = torch.cumsum(counts, 0).double()
    mean_rank = last - (counts.double() - 1) / 2
    ranks = torch.empty_like(values, dtype=torch.float64)
    ranks[order] = mean_rank[inverse]
    return ranks


def defined_on(name: str, y: Tensor) -> bool:
    """Whether metric `name` has a value on a set of nodes with labels `y`: accuracy needs one node,
    ROC-AUC both classes. A client where it has none is left out of that split's client mean."""
    if name == "roc_auc":
        return bool((y == 1).any() and (y != 1).any())
    return y.numel() > 0


def metric_fn(name: str):
    return {"accuracy": accuracy, "roc_auc": roc_auc}[name]


def metric_of_clients(name: str, logits: Tensor, y: Tensor, mask: Tensor) -> Tensor:
    """Metric `name` of every client m over its nodes where `mask[m]`: logits [M, N, C], y and mask [M, N] -> [M].

    The batched path's clients share one padded array; accuracy is counted for all of them in one
    pass (the count of hits over the count of nodes, the number `accuracy` gives: both are sums of
    zeros and ones, exact in float32, divided once). Other metrics are taken client by client.
    """
    if name == "accuracy":
        hits = ((logits.argmax(dim=-1) == y) & mask).sum(dim=1)
        return hits.float() / mask.sum(dim=1).float()  # 0/0 = NaN for a client without such nodes
    metric = metric_fn(name)
    return torch.stack([metric(logits[m][mask[m]], y[m][mask[m]]) for m in range(len(logits))])
