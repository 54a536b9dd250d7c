"""Partial participation (`--participation F`, docs/protocol.md "Partial participation"): which clients a run
samples, that F = 1 is today's run exactly, and what enters the run key and the record."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from gflbench.commands.app import app
from gflbench.core.randomness import Participation, sampled_count
from gflbench.errors import UserError
from gflbench.experiments.runner import run
from gflbench.experiments.spec import make_spec, spec_of_record
from gflbench.experiments.store import RunStore

VOLATILE = ("started_at", "finished_at", "seconds_per_round", "first_round_seconds", "seconds_per_phase",
            "peak_memory_bytes", "peak_reserved_bytes")  # fmt: skip


def stable(record: dict) -> dict:
    """A record without its timings and memory, which differ between two runs of one experiment."""
    return {key: value for key, value in record.items() if key not in VOLATILE}


@pytest.mark.parametrize(("fraction", "clients", "count"), [(0.3, 10, 3), (0.5, 5, 3), (0.1, 10, 1), (0.01, 10, 1)])
def test_sampled_count_is_the_ceiling_of_the_written_fraction(fraction, clients, count):
    assert sampled_count(fraction, clients) == count


def test_sampling_draws_from_its_own_stream():
    """Drawing participants leaves the process-wide generators where they were; the same seed draws the same ids."""
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    before = random.random(), np.random.rand(), torch.rand(1).item()
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    first = Participation(0.5, 10, seed=3)
    drawn = [first.next_round() for _ in range(4)]
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == before
    again = Participation(0.5, 10, seed=3)
    assert [again.next_round() for _ in range(4)] == drawn
    assert all(len(ids) == 5 and ids == sorted(set(ids)) for ids in drawn)
    assert len({tuple(ids) for ids in drawn}) > 1, "rounds draw different sets"
    other = Participation(0.5, 10, seed=4)
    assert [other.next_round() for _ in range(4)] != drawn
    assert Participation(1.0, 10, seed=3).next_round() == list(range(10))


def test_full_participation_is_the_run_without_the_option(tiny_federation, cpu):
    """F = 1.0 keeps the run key of every stored run and computes the same record, bit for bit."""
    absent = make_spec("fedpub", "tiny", "metis", 5, 0, rounds=2, local_epochs=1)
    full = make_spec("fedpub", "tiny", "metis", 5, 0, rounds=2, local_epochs=1, participation=1.0)
    assert full.run_key == absent.run_key and full.config_key == absent.config_key
    a, b = run(absent, tiny_federation, cpu), run(full, tiny_federation, cpu)
    assert stable(a) == stable(b)
    assert a["participation"] == 1.0 and a["participants"] is None


def test_half_participation_keys_and_repeats(tiny_federation, cpu):
    """F = 0.5 enters the run key (not the config key), and a re-run samples the same clients and numbers."""
    absent = make_spec("fedavg", "tiny", "metis", 5, 0, rounds=3, local_epochs=1)
    half = make_spec("fedavg", "tiny", "metis", 5, 0, rounds=3, local_epochs=1, participation=0.5)
    assert half.run_key != absent.run_key and half.config_key == absent.config_key
    first, second = run(half, tiny_federation, cpu), run(half, tiny_federation, cpu)
    assert first["participants"] == second["participants"] and len(first["participants"]) == 3
    assert all(len(ids) == 3 for ids in first["participants"])
    assert stable(first) == stable(second)
    assert spec_of_record(first).run_key == first["run_key"]
    assert first["curves"] != run(absent, tiny_federation, cpu)["curves"], "sampling changes what is trained"


@pytest.mark.parametrize("fraction", [0.0, -0.5, 1.5, float("nan")])
def test_participation_outside_the_unit_interval_is_refused(fraction):
    with pytest.raises(UserError, match=r"--participation must be in \(0, 1\]"):
        make_spec("fedavg", "tiny", "metis", 5, 0, participation=fraction)


@pytest.mark.parametrize(
    ("fraction", "method", "message"),
    [
        ("0", "fedavg", r"--participation must be in (0, 1], got 0.0"),
        ("1.5", "fedavg", r"--participation must be in (0, 1], got 1.5"),
        ("0.5", "gcfl", "gcfl cannot run with --participation below 1: "),
    ],
)
def test_cli_refuses_with_one_line_and_stores_nothing(tmp_path, monkeypatch, fraction, method, message):
    store = tmp_path / "runs.sqlite"
    monkeypatch.setenv("GFLBENCH_DATA", str(tmp_path / "data"))
    args = ["run", "-m", method, "-d", "tiny", "--clients", "5", "--seeds", "1", "--rounds", "1",
            "--participation", fraction, "--store", str(store)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
    assert not store.exists()


def test_cli_stores_a_sampled_run_under_its_own_key(tmp_path, monkeypatch):
    """`run --participation 0.5` stores F and the sampled ids; F = 1 and F = 0.5 are two runs of one configuration."""
    store = tmp_path / "runs.sqlite"
    monkeypatch.setenv("GFLBENCH_DATA", str(tmp_path / "data"))
    base = ["run", "-m", "fedavg", "-d", "tiny", "--clients", "5", "--seeds", "1", "--rounds", "2",
            "--store", str(store)]  # fmt: skip
    for extra in (["--participation", "0.5"], ["--participation", "1"]):
        result = CliRunner().invoke(app, base + extra)
        assert result.exit_code == 0, result.output
    records = RunStore(store).records()
    assert sorted(r["participation"] for r in records) == [0.5, 1.0]
    half = next(r for r in records if r["participation"] == 0.5)
    assert len(half["participants"]) == 2 and all(len(ids) == 3 for ids in half["participants"])
    assert len({r["config_key"] for r in records}) == 1 and len({r["run_key"] for r in records}) == 2
    # A table reads the runs of its own fraction only (they share the configuration key) and states it.
    tables = {}
    for fraction in ("1", "0.5"):
        args = ["table", "-d", "tiny", "-m", "fedavg", "--rounds", "2", "--seeds", "1", "-f", "csv",
                "--participation", fraction, "--store", str(store)]  # fmt: skip
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        tables[fraction] = result.stdout
    assert "participation F = 0.5" in tables["0.5"] and "participation" not in tables["1"]
    for fraction, value in (("1", 1.0), ("0.5", 0.5)):
        test = next(r["test"] for r in records if r["participation"] == value)
        assert f"{100 * test:.2f}" in tables[fraction]
    # Exported and imported elsewhere, both runs keep their keys (import recomputes each key with its F).
    exported, copy = tmp_path / "runs.jsonl.gz", tmp_path / "copy.sqlite"
    assert CliRunner().invoke(app, ["export", str(exported), "--store", str(store)]).exit_code == 0
    result = CliRunner().invoke(app, ["import", str(exported), "--store", str(copy)])
    assert result.exit_code == 0, result.output
    assert sorted(r["run_key"] for r in RunStore(copy).records()) == sorted(r["run_key"] for r in records)


def test_sweep_plans_the_runs_of_its_fraction(tmp_path, monkeypatch):
    """`sweep --participation 0.5` finds the stored 0.5 run; the same grid at F = 1 still lacks its run."""
    store = tmp_path / "runs.sqlite"
    monkeypatch.setenv("GFLBENCH_DATA", str(tmp_path / "data"))
    grid = ["-m", "fedavg", "-d", "tiny", "--clients", "5", "--seeds", "1", "--rounds", "2", "--store", str(store)]
    assert CliRunner().invoke(app, ["run", *grid, "--participation", "0.5"]).exit_code == 0
    planned = {}
    for fraction in ("0.5", "1"):
        result = CliRunner().invoke(app, ["sweep", *grid, "--participation", fraction, "--dry-run"])
        assert result.exit_code == 0, result.output
        planned[fraction] = result.output
    assert "1 runs in the grid, 0 missing" in planned["0.5"] and "1 runs in the grid, 1 missing" in planned["1"]
    refused = CliRunner().invoke(app, ["sweep", *grid[:1], "fedici", *grid[2:], "--participation", "0.5", "--dry-run"])
    assert refused.exit_code == 2 and "fedici cannot run with --participation below 1" in refused.stderr


def test_global_model_reading(tiny_federation, cpu):
    """FedAvg's record scores its global model after each aggregation on every client (docs/protocol.md,
    "Evaluation modes"): the mean over clients, at the best global-validation round; FedPer, whose heads stay
    local, has no number there."""
    record = run(make_spec("fedavg", "tiny", "metis", 5, 0, rounds=3, local_epochs=1), tiny_federation, cpu)
    curves, clients = record["global_curves"], record["global_client_curves"]
    assert len(curves["test"]) == 3 and all(len(row) == 5 for row in clients["test"])
    assert curves["test"] == pytest.approx([float(np.nanmean(row)) for row in clients["test"]])
    assert record["global_test"] == curves["test"][record["global_best_round"]]
    assert curves["test"] != record["curves"]["test"], "before local training is another reading"
    fedper = run(make_spec("fedper", "tiny", "metis", 5, 0, rounds=2, local_epochs=1), tiny_federation, cpu)
    assert fedper["global_curves"] is None and fedper["global_test"] is None
