"""FedGMC's Sinkhorn solvers: the assignment F_m of a client's B sampled measures to the Q structural
templates (paper §4.3.2, Eq. 7), solved per client or, on the batched path, for every client at once.

A POT wrapper with the choices FedGMC makes (standardised costs, tolerance, unbalanced variant), apart from
methods/fedgmc.py so that file reads as the algorithm; docs/fedgmc.md, item 9, says why the costs are standardised.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def sinkhorn_assignment(costs: Tensor, reg: float, relative: bool = True, marginal: float = 0.0) -> Tensor:
    """F ∈ R^{B×Q}: Sinkhorn-Knopp plan between uniform marginals on the B measures and the Q templates
    (POT `ot.sinkhorn`), scaled so each row sums to 1 ((F)_bq = P(measure b ↦ template q)).

    `marginal` > 0 solves the unbalanced problem instead (POT `ot.sinkhorn_unbalanced`, KL penalty of
    that weight on both marginals) and normalises each row to 1: the paper names Sinkhorn-Knopp, which
    is the balanced solver, so 0 is the default; the unbalanced one lets popular templates take more.

    The uniform column marginal spreads the measures over all templates, which keeps a template from
    capturing every node. The plan is a constant of the loss (Eq. 7 is differentiated in W only).

    With `relative`, the costs are standardised first (zero mean, unit spread), so that `reg` sets how
    sharp F is whatever the scale of the costs. With an absolute `reg`, embeddings that have gathered
    (costs that differ little across templates) get a uniform F, which pulls every measure towards the
    mean template and makes every refined template the same barycentre: a fixed point the structural
    calibration cannot leave (docs/fedgmc.md, item 9).

    The plan is solved in NumPy: on a B×Q matrix POT's NumPy backend is twice as fast as its torch one
    on a CPU, and on a GPU the copy is one transfer per client and round (F is solved once per round);
    the batched path copies every client's costs in one transfer (`sinkhorn_assignments`).
    """
    import ot  # here, not at module level: POT loads scikit-learn, 90 MB of RSS that runs of other methods need not pay

    rows, cols = costs.shape
    matrix = _sinkhorn_costs(costs, relative)
    # stopThr 1e-6 (POT's default is 1e-9): F then differs from the converged plan by < 1e-4 per entry
    # on Cora, at 60 % of the iterations, which are this call's cost (the chosen runs did not change).
    a, b = np.full(rows, 1.0 / rows), np.full(cols, 1.0 / cols)
    if marginal > 0:
        plan = ot.sinkhorn_unbalanced(a, b, matrix, reg, marginal, stopThr=1e-6)
        plan = plan / np.maximum(plan.sum(1, keepdims=True), np.finfo(plan.dtype).tiny)
    else:
        plan = ot.sinkhorn(a, b, matrix, reg, stopThr=1e-6) * rows
    return torch.from_numpy(plan).to(device=costs.device, dtype=costs.dtype)


def sinkhorn_assignments(costs: Tensor, reg: float, relative: bool = True) -> Tensor:
    """The balanced `sinkhorn_assignment` of R problems at once, costs [R, B, Q] -> F [R, B, Q].

    POT's batched Sinkhorn (`ot.solve_batch`) runs one iteration for all R problems, so its NumPy call
    overhead, which is the cost of a 64×10 solve, is paid once instead of R times (bench/sinkhorn_batch.py;
    docs/results.md, "Measurements behind design choices"). It stops when the worst problem's marginal error is below the
    same 1e-6 as `sinkhorn_assignment`, so each plan is at least as converged as when solved alone and
    differs from it by less than the tolerance (tests/test_fedgmc.py).
    """
    import ot

    rows = costs.shape[1]
    host = costs.detach().double().cpu().numpy()  # one transfer for the R problems
    matrices = np.stack([_standardised(m) if relative else m for m in host])
    plans = ot.solve_batch(matrices, reg=reg, tol=1e-6, method="sinkhorn", grad="detach").plan * rows
    return torch.from_numpy(np.asarray(plans)).to(device=costs.device, dtype=costs.dtype)


def _sinkhorn_costs(costs: Tensor, relative: bool) -> np.ndarray:
    """The cost matrix as Sinkhorn sees it: float64 NumPy, standardised when `relative`."""
    matrix = costs.detach().double().cpu().numpy()
    return _standardised(matrix) if relative else matrix


def _standardised(matrix: np.ndarray) -> np.ndarray:
    """One cost matrix with zero mean and unit spread (`sinkhorn_assignment`'s `relative`)."""
    return (matrix - matrix.mean()) / (matrix.std() + 1e-12)
