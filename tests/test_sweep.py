"""`gflbench sweep`: table grids, dry runs, failed runs recorded while the sweep goes on, Ray when installed."""

from __future__ import annotations

import importlib.util

import pytest
from typer.testing import CliRunner

from cli import app
from gfl_bench.store import RunStore
from gfl_bench.sweep import grid_specs, table_grid

TINY = ["-d", "tiny", "--clients", "5", "--seeds", "2", "--rounds", "3"]


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("GFLBENCH_DATA", str(tmp_path / "data"))
    return tmp_path / "runs.sqlite"


def test_table_grids_follow_the_paper():
    everything = ["local", "fedavg", "fedgmc", "fedgmc-wo-semantic", "fedgmc-wo-structural", "fedgmc-wo-refinement"]
    one = table_grid("1", everything)
    assert one.methods == ("local", "fedavg", "fedgmc") and "fedpub" in one.skipped
    assert one.datasets[0] == "cora" and len(one.datasets) == 6 and one.settings == (("metis", 5), ("metis", 10), ("metis", 20))
    assert len(grid_specs(one, 10, {})) == 3 * 6 * 3 * 10
    five = table_grid("5", everything)
    assert five.settings == (("overlap", 10), ("overlap", 30), ("overlap", 50)) and "questions" in five.datasets
    six = table_grid("6", everything)
    assert set(six.methods) == set(everything) - {"local", "fedavg"} and len(six.settings) == 6 and len(six.datasets) == 11
    assert table_grid("7", everything).datasets == ("cora", "roman-empire")


def test_dry_run_lists_only_missing_runs(store):
    runner = CliRunner()
    done = runner.invoke(app, ["sweep", "-m", "fedavg", *TINY, "--store", str(store)])
    assert done.exit_code == 0, done.output
    plan = runner.invoke(app, ["sweep", "-m", "fedavg,local", *TINY, "--store", str(store), "--dry-run"])
    assert plan.exit_code == 0, plan.output
    assert "4 runs in the grid, 2 missing" in plan.output
    assert "| local" in plan.stdout and "| fedavg" not in plan.stdout
    assert len(RunStore(store)) == 2  # a dry run runs nothing


def test_failed_run_is_recorded_and_the_sweep_goes_on(store):
    runner = CliRunner()
    args = ["sweep", "-m", "fedavg,local", *TINY, "--store", str(store), "--set", "fedavg.lr=1e30"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output  # the grid went on, and the command says some runs failed
    assert "2 runs of this grid are stored as failed" in result.stderr and "gflbench failed" in result.stderr
    with RunStore(store) as runs:
        frame = runs.frame()
    assert set(frame[frame["method"] == "fedavg"]["status"]) == {"failed"}
    assert set(frame[frame["method"] == "local"]["status"]) == {"ok"}
    assert "non-finite" in RunStore(store).records(frame[frame["method"] == "fedavg"]["run_key"])[0]["error"]
    table = runner.invoke(app, ["table", "-d", "tiny", "--rounds", "3", "--set", "fedavg.lr=1e30", "-f", "csv",
                                "--store", str(store)])  # fmt: skip
    assert "FedAvg [gcn],failed" in table.stdout
    again = runner.invoke(app, args)
    assert "4 runs asked, 4 already stored, 0 to run" in again.output and "--retry-failed" in again.stderr


def test_parallel_workers_store_every_run_once(store):
    result = CliRunner().invoke(app, ["sweep", "-m", "fedavg,local", *TINY, "--store", str(store), "--workers", "2"])
    assert result.exit_code == 0, result.output
    with RunStore(store) as runs:
        assert len(runs) == 4 and set(runs.frame()["status"]) == {"ok"}


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed (optional extra)")
def test_sweep_under_ray_local_cluster(store):
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        result = CliRunner().invoke(app, ["sweep", "-m", "fedavg", *TINY, "--store", str(store), "--executor", "ray"])
        assert result.exit_code == 0, result.output
        assert len(RunStore(store)) == 2
    finally:
        ray.shutdown()
