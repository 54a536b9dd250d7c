"""The batched path (gfl_bench/batched.py) computes what the per-client path computes."""

from __future__ import annotations

import numpy as np
import pytest

from gfl_bench.runner import DataCache, run
from gfl_bench.spec import make_spec


@pytest.mark.parametrize("method", ["local", "fedavg", "fedper"])
@pytest.mark.parametrize("epochs", [1, 2])
def test_batched_clients_give_the_per_client_numbers(tiny_federation, cpu, method, epochs):
    spec = make_spec(method, "tiny", "metis", 5, 3, rounds=4, local_epochs=epochs)
    one_by_one = run(spec, tiny_federation, cpu)
    together = run(spec, tiny_federation, cpu, batched=True)
    assert (one_by_one["execution"], together["execution"]) == ("per-client", "batched")
    assert together["best_round"] == one_by_one["best_round"]
    for key in ("val", "test"):  # every client, every round
        np.testing.assert_allclose(together["client_curves"][key], one_by_one["client_curves"][key], atol=1e-6)


def test_batched_logits_match_after_three_rounds_on_cora(cpu):
    import os
    from pathlib import Path

    if not (Path(os.environ.get("GFLBENCH_RAW_MIRROR", "../shared/data")) / "Cora").is_dir():
        pytest.skip("Cora raw files not in GFLBENCH_RAW_MIRROR")
    data = DataCache(None, None).federated("cora", "metis", 10, 1234)
    spec = make_spec("fedavg", "cora", "metis", 10, 0, rounds=3)
    records = [run(spec, data, cpu, snapshot_rounds=frozenset(), batched=b) for b in (False, True)]
    assert records[1]["execution"] == "batched"
    np.testing.assert_allclose(records[1]["client_curves"]["val"], records[0]["client_curves"]["val"], atol=1e-6)
    assert records[1]["test"] == pytest.approx(records[0]["test"], abs=1e-6)


def test_methods_that_cannot_batch_run_per_client(tiny_federation, cpu):
    spec = make_spec("fedavg", "tiny", "metis", 5, 0, {"backbone": "h2gcn-tanh"}, rounds=2)
    assert run(spec, tiny_federation, cpu, batched=True)["execution"] == "per-client"
    prox = make_spec("fedprox", "tiny", "metis", 5, 0, rounds=2)
    assert run(prox, tiny_federation, cpu, batched=True)["execution"] == "per-client"
