"""Shared fixtures: the synthetic `tiny` federation, the CPU, and the device under test.

`device` is the CPU unless GFLBENCH_TEST_DEVICE names another (`cuda`, `cuda:1`): bench/gpu_check.sh
runs the device-agnostic test files with it set. Tests whose claim holds on the CPU only (the batched
path's number-for-number equality: CUDA draws dropout from another RNG stream) ask for `cpu`.
"""

from __future__ import annotations

import os

import pytest
import torch

from gflbench.experiments.runner import DataCache, FederatedData

torch.set_num_threads(1)  # tiny graphs: threads only add contention on a busy 2-core runner


@pytest.fixture(scope="session")
def tiny_federation() -> FederatedData:
    return DataCache(None, None).federated("tiny", "metis", 5, 1234)


@pytest.fixture
def cpu() -> torch.device:
    return torch.device("cpu")


@pytest.fixture
def device() -> torch.device:
    chosen = torch.device(os.environ.get("GFLBENCH_TEST_DEVICE") or "cpu")
    if chosen.type == "cuda" and not torch.cuda.is_available():
        pytest.skip("GFLBENCH_TEST_DEVICE names CUDA, which this machine lacks")
    return chosen
