"""Per-client metrics computed on the device (no host round-trip inside the training loop)."""

from __future__ import annotations

import torch
from torch import Tensor

METRICS = ("accuracy", "roc_auc")


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


def metric_fn(name: str):
    return {"accuracy": accuracy, "roc_auc": roc_auc}[name]
