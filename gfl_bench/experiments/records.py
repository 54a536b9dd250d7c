"""What a stored record derives from its configuration and its curves: its keys and its best round.

Plain values in, plain values out (hashlib, json, NumPy; no torch), so that the runner, which writes these
fields, and `gflbench import`, which recomputes them to check an exported record (`store.check_record`),
share one definition without the importer loading the engine.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np


def config_key_of(config: Mapping[str, Any]) -> str:
    """The key of a resolved configuration (`RunSpec.config`); `gflbench import` recomputes it from a record."""
    return _digest(config)


def run_key_of(config_key: str, dataset: str, scheme: str, clients: int, seed: int, participation: float = 1.0) -> str:
    """The key of one run of a configuration; `gflbench import` recomputes it from a record.

    A participation F < 1 (clients sampled per round) enters the key as the partition does; F = 1, every
    client in every round, is what every run stored before the option computed, so it stays out of it."""
    payload: dict[str, Any] = {
        "config": config_key,
        "dataset": dataset,
        "scheme": scheme,
        "clients": clients,
        "seed": seed,
    }
    if participation != 1:
        payload["participation"] = participation
    return _digest(payload)


def run_key_of_record(record: Mapping[str, Any], config_key: str) -> str:
    """The run key of a stored record's cell and seed under `config_key` (its own, or the one an upgrade gives it);
    a record without `participation` was made before partial participation and ran every client."""
    return run_key_of(config_key, record["dataset"], record["scheme"], record["clients"], record["seed"],
                      record.get("participation", 1.0))  # fmt: skip


def _digest(payload: Mapping[str, Any]) -> str:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def best_round(val_curve: list[float]) -> int:
    """The first round with the highest client-mean validation value (NaN rounds never win)."""
    values = np.array(val_curve, dtype=float)
    return 0 if np.isnan(values).all() else int(np.nanargmax(values))


def per_client_best(val: list[list[float]], test: list[list[float]]) -> tuple[float, float]:
    """Client-mean validation and test values when each client keeps its own best-validation round.

    The alternative selection rule of FedICI's released code (docs/protocol.md, "Selection rules"):
    client c contributes test[r_c][c] at r_c = its first round with the highest validation value.
    Clients whose validation value is undefined in every round, or whose test value is undefined at
    r_c, are left out of the mean, as in the per-round client mean.
    """
    val_matrix, test_matrix = np.array(val, dtype=float), np.array(test, dtype=float)
    chosen_val, chosen_test = [], []
    for column in range(val_matrix.shape[1]):
        if np.isnan(val_matrix[:, column]).all():
            continue
        best = int(np.nanargmax(val_matrix[:, column]))
        chosen_val.append(val_matrix[best, column])
        chosen_test.append(test_matrix[best, column])
    finite_val, finite_test = np.array(chosen_val), np.array(chosen_test)
    finite_test = finite_test[~np.isnan(finite_test)]
    mean_val = float(finite_val.mean()) if finite_val.size else math.nan
    mean_test = float(finite_test.mean()) if finite_test.size else math.nan
    return mean_val, mean_test
