"""AdaFGL's homophily confidence score (HCS, step 2 of baselines/adafgl.py's docstring): label propagation
from a random half of a client's training labels, scored on the other half, which picks the stage-2 branch.

Apart from baselines/adafgl.py because it is self-contained: a propagation operator, the labels and a seeded
generator in, one score out; the client only compares the score with `threshold`.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F


def label_propagation(operator: Tensor, start: Tensor, seeds: Tensor, steps: int, alpha: float) -> Tensor:
    """Y ← α ÂY + (1 − α)Y⁰, then Y[seeds] += Y⁰[seeds], `steps` times (official `init_lp_propagate`).

    operator: Â, sparse [N, N]; start: Y⁰ [N, C]; seeds: bool [N].
    """
    reinforce = start * seeds.unsqueeze(1).to(start.dtype)
    y = start
    for _ in range(steps):
        y = alpha * torch.sparse.mm(operator, y) + (1 - alpha) * start + reinforce
    return y


def split_train(train_index: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """A random half of the training nodes as LP seeds (⌊n/2⌋) and the rest held out."""
    order = train_index[torch.randperm(train_index.numel(), generator=generator).to(train_index.device)]
    half = train_index.numel() // 2
    return order[:half], order[half:]


def homophily_confidence(
    operator: Tensor,
    y: Tensor,
    train_index: Tensor,
    num_classes: int,
    steps: int,
    alpha: float,
    generator: torch.Generator,
) -> Tensor:
    """HCS: accuracy of label propagation from half of the training labels on the other half (NaN if none held out)."""
    seeds, held = split_train(train_index, generator)
    n = y.shape[0]
    start = torch.full((n, num_classes), 1.0 / num_classes, device=y.device)
    start[seeds] = F.one_hot(y[seeds], num_classes).to(start.dtype)
    seed_mask = torch.zeros(n, dtype=torch.bool, device=y.device)
    seed_mask[seeds] = True
    propagated = label_propagation(operator, start, seed_mask, steps, alpha)
    return (propagated[held].argmax(dim=1) == y[held]).float().mean()
