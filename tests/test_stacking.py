"""Runs stacked along a seed axis (runner.run_together) give each seed the record it gives alone."""

from __future__ import annotations

import numpy as np
import pytest

from gflbench.experiments import execute
from gflbench.experiments.execute import Environment, run_job, stacked_jobs
from gflbench.experiments.runner import RunFailed, run, run_together
from gflbench.experiments.spec import make_spec

CASES = [
    ("fedavg", {}), ("fedprox", {"mu": "0.5"}), ("gcfl", {}), ("fedpub", {}), ("fedgmc", {}),
    ("fedsage+", {"local_gen_epochs": "3", "fed_gen_epochs": "2"}),  # per-client generator stages, each seed on its own streams
]  # fmt: skip


@pytest.mark.parametrize(("method", "overrides"), CASES)
def test_each_stacked_seed_equals_its_run_alone(tiny_federation, device, method, overrides):
    specs = [make_spec(method, "tiny", "metis", 5, seed, overrides, rounds=4, local_epochs=2) for seed in (0, 1, 2)]
    stacked = run_together(specs, tiny_federation, device, batched=True)
    alone = [run(spec, tiny_federation, device, batched=True) for spec in specs]
    assert [r["seed"] for r in stacked] == [0, 1, 2] and {r["stacked_runs"] for r in stacked} == {3}
    # CPU: the same arithmetic row by row, so equal; CUDA kernels may sum in another order for a bigger
    # batch, which can flip a tied prediction (1/60 of a client's nodes)
    atol = 1e-6 if device.type == "cpu" else 0.05
    for together, single in zip(stacked, alone, strict=True):
        np.testing.assert_allclose(together["client_curves"]["val"], single["client_curves"]["val"], atol=atol)
        np.testing.assert_allclose(together["client_curves"]["test"], single["client_curves"]["test"], atol=atol)
        assert (
            together["bytes_up"] == single["bytes_up"]
            and together["diagnostics"].keys() == single["diagnostics"].keys()
        )
    assert len({r["test"] for r in stacked}) > 1  # the seeds really differ: no run read another's stream


def test_only_seeds_of_one_batchable_configuration_stack(tiny_federation, cpu):
    seeds = [make_spec("fedavg", "tiny", "metis", 5, s, rounds=2) for s in range(5)]
    other = [make_spec("fedavg", "tiny", "metis", 5, s, {"lr": "0.05"}, rounds=2) for s in range(2)]
    lone = [make_spec("fedgta", "tiny", "metis", 5, s, rounds=2) for s in range(2)]  # not batchable
    jobs = stacked_jobs(seeds + lone + other, 2)
    assert [[s.seed for s in job] for job in jobs] == [[0, 1], [2, 3], [4], [0], [1], [0, 1]]
    assert [job[0].method for job in jobs] == ["fedavg"] * 3 + ["fedgta"] * 2 + ["fedavg"]
    assert stacked_jobs(seeds, 1) == [[s] for s in seeds]
    with pytest.raises(ValueError, match="stack"):
        run_together(seeds[:1] + other[:1], tiny_federation, cpu, batched=True)


def test_a_failing_stack_is_rerun_one_seed_at_a_time(monkeypatch):
    """One diverging seed must not cost the others their runs: the job falls back to single runs."""
    calls = []

    def flaky(specs, *args, **kwargs):
        calls.append(len(specs))
        if len(specs) > 1:
            raise RunFailed("non-finite predictions at round 1")
        return run_together(specs, *args, **kwargs)

    monkeypatch.setattr(execute, "run_together", flaky)
    specs = [make_spec("fedavg", "tiny", "metis", 5, s, rounds=2) for s in range(3)]
    records = run_job(specs, Environment(device="cpu", stack_seeds=3))
    assert calls == [3, 1, 1, 1]
    assert [r["status"] for r in records] == ["ok"] * 3 and [r["seed"] for r in records] == [0, 1, 2]
