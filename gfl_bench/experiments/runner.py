"""The experiment layer of a run: one RunSpec in, one stored record out (`run`); or several seeds of one
batchable configuration stepped together, one record each (`run_together`, `--stack-seeds`).

The engine (gfl_bench/core/rounds.py) trains and measures; this module names the run (its spec's keys and
configuration), applies the selection rules (gfl_bench/experiments/records.py: the reported test value is the one at
the round with the best client-mean validation value; the per-client rule takes each client's own best
round) and adds the provenance, giving the record results/README.md describes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gflbench.core.federation import DataCache, FederatedData, check_measurable
from gflbench.core.method import method_class
from gflbench.core.rounds import Job, RunFailed, RunResult, resolve_device, train
from gflbench.data import dataset_spec
from gflbench.experiments.provenance import provenance
from gflbench.experiments.records import best_round, per_client_best
from gflbench.experiments.spec import RunSpec
from gflbench.experiments.store import finite

# The engine's names the experiment layer's callers use with `run` (execute, tune, cli): one import for both.
__all__ = [
    "DataCache", "FederatedData", "RunFailed", "best_round", "check_measurable", "excluded_clients", "failed_record",
    "per_client_best", "resolve_device", "run", "run_together",
]  # fmt: skip


def run(
    spec: RunSpec,
    data: FederatedData,
    device: torch.device,
    on_round: Callable[[int, float, float], None] | None = None,
    snapshot_rounds: frozenset[int] = frozenset(),
    snapshot_dir: Path | None = None,
    batched: bool = False,
    sparse_features: bool = False,
) -> dict[str, Any]:
    """Train `spec` on `data` and return its record (see gfl_bench/experiments/store/ for the fields).

    At each round in `snapshot_rounds` the server's `snapshot()` is saved to
    `snapshot_dir/<run_key>/round<r>.pt` for case-study figures. `batched` and `sparse_features` are
    the engine's (`rounds.train`); the record says which path ran (`execution`) and the feature layout
    (`features`). Both change float summation order only.
    """
    callback = None if on_round is None else (lambda _spec, index, val, test: on_round(index, val, test))
    return run_together([spec], data, device, callback, snapshot_rounds, snapshot_dir, batched, sparse_features)[0]


def run_together(
    specs: list[RunSpec],
    data: FederatedData,
    device: torch.device,
    on_round: Callable[[RunSpec, int, float, float], None] | None = None,
    snapshot_rounds: frozenset[int] = frozenset(),
    snapshot_dir: Path | None = None,
    batched: bool = False,
    sparse_features: bool = False,
) -> list[dict[str, Any]]:
    """Train several runs of one configuration that differ in their seed, stacked along a seed axis
    (`rounds.train`), one record each; each equals the one the run gives alone (`run`), up to float
    summation order. The record's `stacked_runs` says how many shared the rounds; `seconds_per_round`
    is the run's share of them. Runs that sample clients (`participation` below 1) are not stacked: each
    is trained alone, in turn (the batched pass trains every client)."""
    if len(specs) > 1 and any(s.participation != 1 for s in specs):
        return [record for s in specs for record in run_together([s], data, device, on_round, snapshot_rounds,
                                                                  snapshot_dir, batched, sparse_features)]  # fmt: skip
    jobs = [
        Job(method_class(s.method), s.params, s.seed, s.rounds, s.local_epochs, s.run_key, s.participation)
        for s in specs
    ]
    by_job = {id(job): spec for job, spec in zip(jobs, specs)}
    callback = None if on_round is None else (lambda job, index, val, test: on_round(by_job[id(job)], index, val, test))
    results = train(jobs, data, device, callback, snapshot_rounds, snapshot_dir, batched, sparse_features)
    return [_record(spec, result, data, device) for spec, result in zip(specs, results)]


def _record(spec: RunSpec, result: RunResult, data: FederatedData, device: torch.device) -> dict[str, Any]:
    """The stored record of one finished run (results/README.md lists the fields). A value undefined for
    a client (NaN: no such node, or a ROC-AUC split lacking a class) is null in it: JSON has no NaN."""
    curves = result.curves
    best = best_round(curves["val"])
    val_client_best, test_client_best = per_client_best(result.client_curves["val"], result.client_curves["test"])
    return finite(
        {
            **_identity(spec),
            "metric": data.metric,
            "status": "ok",
            "best_round": best,
            "val": curves["val"][best],
            "test": curves["test"][best],
            "val_weighted": curves["val_weighted"][best],
            "test_weighted": curves["test_weighted"][best],
            "val_client_best": val_client_best,
            "test_client_best": test_client_best,
            "curves": curves,
            "client_curves": result.client_curves,
            "excluded_clients": {split: excluded_clients(result.client_curves[split]) for split in ("val", "test")},
            **_global_reading(result),
            "seconds_per_round": result.seconds,
            # round 0 apart: it carries one-off work (CUDA and library start-up, FedSage+'s generator phase);
            # the store's summary column is the median of the later rounds (store.round_seconds)
            "first_round_seconds": result.seconds[0],
            "seconds_per_phase": result.phases,
            "execution": result.execution,
            "stacked_runs": result.stacked_runs,
            "features": result.features,
            **result.peaks,
            "bytes_up": result.bytes_up,
            "bytes_down": result.bytes_down,
            "diagnostics": result.diagnostics,
            # the ids that took part in each round; with every client in every round (F = 1), not repeated
            "participants": result.participants if spec.participation != 1 else None,
            "partition_hash": data.partition.digest(),
            "data_fingerprint": data.data_fingerprint,  # not in the run key: stored keys stay valid; `import` may compare it
            "started_at": result.started,
            "finished_at": time.time(),
            **provenance(device),
            "nondeterministic_kernels": result.nondeterministic_kernels,
        }
    )


def _global_reading(result: RunResult) -> dict[str, Any]:
    """The global (or cluster) model's reading (docs/protocol.md, "Evaluation modes"): its curves, and its
    values at the round with its best client-mean validation value. Null for a method without such a model:
    it has no number there, not a zero."""
    curves = result.global_curves
    if not curves["val"]:
        return dict.fromkeys(
            ("global_curves", "global_client_curves", "global_best_round", "global_val", "global_test")
        )
    best = best_round(curves["val"])
    return {
        "global_curves": curves,
        "global_client_curves": result.global_client_curves,
        "global_best_round": best,
        "global_val": curves["val"][best],
        "global_test": curves["test"][best],
    }


def _identity(spec: RunSpec) -> dict[str, Any]:
    return {
        "run_key": spec.run_key,
        "config_key": spec.config_key,
        "method": spec.method,
        "protocol": spec.protocol,
        "dataset": spec.dataset,
        "scheme": spec.scheme,
        "clients": spec.clients,
        "data_seed": spec.data_seed,
        "seed": spec.seed,
        "participation": spec.participation,
        "config": spec.config(),
        "tuned_file": spec.tuned_file,
        "tuned_sha256": spec.tuned_sha256,
    }


def failed_record(spec: RunSpec, error: BaseException, device: torch.device, started: float) -> dict[str, Any]:
    """The record of a run that raised: kept so that tables show the cell as failed, with the reason."""
    return {
        **_identity(spec),
        "metric": dataset_spec(spec.dataset).metric,
        "status": "failed",
        "error": f"{type(error).__name__}: {error}",
        "started_at": started,
        "finished_at": time.time(),
        **provenance(device),
    }


def excluded_clients(client_curve: list[list[float]]) -> int:
    """How many clients a split's client mean leaves out: those whose value is undefined (NaN) there.
    They are the same clients in every round, as a client's nodes and labels do not change."""
    return int(np.isnan(np.array(client_curve, dtype=float)).any(axis=0).sum())
