"""Shared fixtures: the synthetic `tiny` federation and the CPU device."""

from __future__ import annotations

import pytest
import torch

from gfl_bench.runner import DataCache, FederatedData

torch.set_num_threads(1)  # tiny graphs: threads only add contention on a busy 2-core runner

@pytest.fixture(scope="session")
def tiny_federation() -> FederatedData:
    return DataCache(None, None).federated("tiny", "metis", 5, 1234)


@pytest.fixture
def cpu() -> torch.device:
    return torch.device("cpu")
