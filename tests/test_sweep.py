"""`gflbench sweep`: table grids, dry runs, failed runs recorded while the sweep goes on, Ray when installed."""

from __future__ import annotations

import importlib.util
import math

import pandas as pd
import pytest
from typer.testing import CliRunner

from gflbench.commands.app import app
from gflbench.errors import UserError
from gflbench.experiments.spec import make_spec
from gflbench.experiments.store import RunStore
from gflbench.paper.sweep import estimate, grid_specs, load_round_times, table_grid

TINY = ["-d", "tiny", "--clients", "5", "--seeds", "2", "--rounds", "3"]


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("GFLBENCH_DATA", str(tmp_path / "data"))
    return tmp_path / "runs.sqlite"


def test_table_grids_follow_the_paper():
    everything = ["local", "fedavg", "fedgmc", "fedgmc-wo-semantic", "fedgmc-wo-structural", "fedgmc-wo-refinement"]
    one = table_grid("1", everything)
    assert one.methods == ("local", "fedavg", "fedgmc") and "fedpub" in one.skipped
    assert (
        one.datasets[0] == "cora"
        and len(one.datasets) == 6
        and one.settings == (("metis", 5), ("metis", 10), ("metis", 20))
    )
    assert len(grid_specs(one, 10, {})) == 3 * 6 * 3 * 10
    five = table_grid("5", everything)
    assert five.settings == (("overlap", 10), ("overlap", 30), ("overlap", 50)) and "questions" in five.datasets
    six = table_grid("6", everything)
    assert (
        set(six.methods) == set(everything) - {"local", "fedavg"} and len(six.settings) == 6 and len(six.datasets) == 11
    )
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
        # auto on a cluster without GPUs: said once, and each run's line and record name the device
        assert "Ray: device auto runs on the CPU (0 GPUs in the cluster, 0 GPU per run)" in result.stderr
        assert result.stdout.count(" on cpu ") == 2
        assert {r["device"] for r in RunStore(store).records(RunStore(store).frame()["run_key"])} == {"cpu"}
    finally:
        ray.shutdown()


def test_ray_gives_cuda_runs_a_gpu_share():
    """Ray hides the GPUs from a task that reserves none: a CUDA run (or auto on a GPU cluster) gets a share."""
    from gflbench.experiments.execute import ray_gpu_share

    assert ray_gpu_share("cuda", None, workers=4, cluster_gpus=1) == 0.25  # four runs share a GPU
    assert ray_gpu_share("cuda", None, workers=1, cluster_gpus=0) == 1.0  # the driver cannot see the GPUs
    assert ray_gpu_share("auto", None, workers=2, cluster_gpus=8) == 0.5
    assert ray_gpu_share("auto", None, workers=2, cluster_gpus=0) == 0.0  # a CPU cluster: the CPU, said so
    assert ray_gpu_share("cpu", None, workers=2, cluster_gpus=8) == 0.0
    assert ray_gpu_share("cuda", 0.1, workers=2, cluster_gpus=8) == 0.1  # given: used as is
    with pytest.raises(UserError, match="--gpus-per-run 0 with --device cuda"):
        ray_gpu_share("cuda", 0.0, workers=2, cluster_gpus=8)


@pytest.mark.parametrize(("device", "share", "says"), [
    ("cuda", "0", "--gpus-per-run 0 with --device cuda: Ray hides the GPUs"),
    ("cuda:1", "0.5", "use --device cuda"),
    ("cuda", "-1", "--gpus-per-run must be at least 0"),
])  # fmt: skip
def test_ray_refuses_cuda_without_a_gpu_share_in_one_line(store, device, share, says):
    result = CliRunner().invoke(app, ["sweep", "-m", "fedavg", *TINY, "--store", str(store), "--executor", "ray",
                                      "--device", device, "--gpus-per-run", share])  # fmt: skip
    assert result.exit_code == 2 and says in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not store.exists()


MEASURED = """method,dataset,scheme,clients,device,seconds_per_round,peak_mb,machine
fedavg,tiny,metis,5,cpu,0.5,300,test machine
fedavg,tiny,metis,10,cuda,0.1,50,test gpu
local,cora,metis,10,cpu,2.0,400,test machine
"""


def test_estimate_falls_back_to_measured_round_times(tmp_path):
    measured = tmp_path / "round_times.csv"
    measured.write_text(MEASURED)
    table = load_round_times(measured)
    specs = [make_spec(m, "tiny", "metis", c, 0, rounds=4) for m in ("fedavg", "fedprox") for c in (5, 10)]
    plan = estimate(specs, pd.DataFrame(), table, device="cpu").set_index(["method", "clients"])
    assert plan.loc[("fedavg", 5), "basis"] == "round_times.csv" and plan.loc[("fedavg", 5), "est. seconds"] == 0.5 * 4
    assert plan.loc[("fedavg", 10), "basis"] == "round_times.csv, scaled from 5 clients"  # the cuda row is set aside
    assert plan.loc[("fedavg", 10), "est. seconds"] == 0.5 * 10 / 5 * 4
    assert plan.loc[("fedprox", 5), "basis"] == "none" and math.isnan(plan.loc[("fedprox", 5), "est. seconds"])
    on_gpu = estimate(specs[1:2], pd.DataFrame(), table, device="cuda:0")
    assert on_gpu["basis"].tolist() == ["round_times.csv"] and on_gpu["est. seconds"].tolist() == [0.1 * 4]
    stored = pd.DataFrame([{"method": "fedavg", "dataset": "tiny", "scheme": "metis", "clients": 5, "status": "ok",
                            "seconds_per_round": 0.25, "config_key": "another", "protocol": "fair",
                            "finished_at": "2026-12-01T00:00:00"}])  # fmt: skip
    preferred = estimate(specs[:2], stored, table).set_index("clients")
    assert (
        preferred.loc[5, "basis"] == "store (1 runs)" and preferred.loc[10, "basis"] == "store, other settings (1 runs)"
    )


def test_a_stored_estimate_reads_the_newest_runs_closest_to_the_cell():
    """Same configuration before other configurations, the cell's protocol before others, and of those the newest
    NEWEST runs' median: a store also holds tuning trials and runs of slower code (docs/results.md, "Sweep
    estimates")."""
    specs = [make_spec("fedavg", "tiny", "metis", 10, seed, rounds=4) for seed in range(2)]
    own, protocol = specs[0].config_key, specs[0].protocol

    def run(clients: int, seconds: float, key: str, day: int, proto: str = protocol) -> dict:
        return {"method": "fedavg", "dataset": "tiny", "scheme": "metis", "clients": clients, "status": "ok",
                "seconds_per_round": seconds, "config_key": key, "protocol": proto,
                "finished_at": f"2026-12-{day:02d}T00:00:00"}  # fmt: skip

    trials = [run(5, 9.0, f"trial{i}", 1, "fair") for i in range(6)]  # slow tuning trials of other widths
    old = [run(5, 3.0, own, day) for day in (2, 3, 4)]  # the same configuration on slower code
    new = [run(5, seconds, own, day) for seconds, day in ((0.5, 10), (0.7, 11), (0.6, 12), (0.4, 13), (0.8, 14))]
    plan = estimate(specs, pd.DataFrame(trials + old + new), pd.DataFrame())
    assert plan["basis"].tolist() == ["store, other settings, same configuration (5 runs)"]
    assert plan["est. seconds"].tolist() == [0.6 * 4 * 2]  # the median of the five newest, two runs of four rounds
    fair_only = estimate(specs, pd.DataFrame(trials), pd.DataFrame())
    assert fair_only["basis"].tolist() == ["store, other settings (5 runs)"]  # nothing closer: any run of the method
    in_cell = estimate(specs, pd.DataFrame([*new, run(10, 2.0, "other", 1), run(10, 1.0, own, 1)]), pd.DataFrame())
    assert in_cell["basis"].tolist() == ["store, same configuration (1 runs)"]
    assert in_cell["est. seconds"].tolist() == [1.0 * 4 * 2]


def test_measured_table_needs_its_columns(tmp_path):
    bad = tmp_path / "round_times.csv"
    bad.write_text("method,dataset\nfedavg,tiny\n")
    with pytest.raises(UserError, match="seconds_per_round"):
        load_round_times(bad)
    assert load_round_times(tmp_path / "absent.csv").empty


def test_dry_run_says_which_basis(store, tmp_path, monkeypatch):
    measured = tmp_path / "round_times.csv"
    measured.write_text(MEASURED)
    monkeypatch.setenv("GFLBENCH_ROUND_TIMES", str(measured))
    plan = CliRunner().invoke(app, ["sweep", "-m", "fedavg,fedprox", *TINY, "--store", str(store), "--dry-run"])
    assert plan.exit_code == 0, plan.output
    assert "basis" in plan.stdout and "round_times.csv" in plan.stdout and "none" in plan.stdout
    assert "?" in plan.stdout  # fedprox has no basis


def test_packing_rule_is_bounded_by_cores_runs_and_memory():
    from gflbench.paper.sweep import CUDA_CONTEXT_MB, MAX_RUNS_PER_GPU, MEMORY_HEADROOM, packed_workers

    per_gpu_run = 1400.0 + CUDA_CONTEXT_MB  # a run's process: its allocator's reserve and its CUDA context
    free = 6 * per_gpu_run / MEMORY_HEADROOM  # room for exactly six runs
    assert packed_workers(per_gpu_run, free, cores=16, runs=100, cuda=True) == 6  # memory binds
    assert packed_workers(per_gpu_run, free, cores=4, runs=100, cuda=True) == 4  # cores bind
    assert packed_workers(per_gpu_run, free, cores=16, runs=3, cuda=True) == 3  # runs bind
    assert (
        packed_workers(per_gpu_run, free * 100, cores=64, runs=100, cuda=True) == MAX_RUNS_PER_GPU == 8
    )  # a GPU's cap
    assert packed_workers(per_gpu_run, free * 100, cores=16, runs=100, cuda=False) == 16
    assert packed_workers(5000.0, 1000.0, cores=16, runs=100, cuda=False) == 1  # never below one
    assert packed_workers(math.nan, free, cores=16, runs=100, cuda=True) == 1  # unmeasured: one run on a GPU
    assert packed_workers(math.nan, free, cores=16, runs=100, cuda=False) == 16


def test_per_run_memory_comes_from_the_same_device_type(tmp_path):
    from gflbench.paper.sweep import run_memory_mb

    measured = tmp_path / "round_times.csv"
    measured.write_text(MEASURED)
    table = load_round_times(measured)
    tiny = [make_spec("fedavg", "tiny", "metis", 5, 0, rounds=4)]
    assert run_memory_mb(tiny, table, "cpu")[0] == 300
    assert run_memory_mb(tiny, table, "cuda:0") == (50 + 600, "round_times.csv peak_mb + 600 MB assumed CUDA context")
    with_context = table.assign(context_mb=[None, 420.0, None])  # measured on the GPU by bench/round_time.py
    assert run_memory_mb(tiny, with_context, "cuda")[0] == 50 + 420
    other_method = [make_spec("fedprox", "cora", "metis", 10, 0, rounds=4)]
    assert run_memory_mb(other_method, table, "cpu")[0] == 400  # the dataset's largest measured run
    assert math.isnan(run_memory_mb(other_method, table, "cuda")[0])  # cora never measured on a GPU


def test_workers_zero_packs_automatically(store, tmp_path, monkeypatch):
    measured = tmp_path / "round_times.csv"
    measured.write_text(MEASURED)
    monkeypatch.setenv("GFLBENCH_ROUND_TIMES", str(measured))
    result = CliRunner().invoke(app, ["sweep", "-m", "fedavg", *TINY, "--store", str(store), "--workers", "0",
                                      "--device", "cpu"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "packing rule" in result.output and "300 MB per run" in result.output
    with RunStore(store) as runs:
        assert len(runs) == 2


def test_table_all_is_every_table_and_figure_run_once(tmp_path):
    """Cora's FedAvg runs: Table 1's three METIS cells and Table 4's three overlapping ones; Table 7
    asks for the same six again (counted once), Table 6 and the sensitivity figures have no FedAvg."""
    result = CliRunner().invoke(app, ["sweep", "--table", "all", "-d", "cora", "-m", "fedavg", "--seeds", "1",
                                      "--dry-run", "--store", str(tmp_path / "none.sqlite")])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "6 runs in the grid, 6 missing" in result.output
    with_gmc = CliRunner().invoke(app, ["sweep", "--table", "all", "-d", "cora", "-m", "fedgmc", "--seeds", "1",
                                        "--dry-run", "--store", str(tmp_path / "none.sqlite")])  # fmt: skip
    assert with_gmc.exit_code == 0, with_gmc.output
    from gflbench.paper.plots import SENSITIVITY

    varied = sum(len(values) for values in SENSITIVITY.values()) - len(SENSITIVITY) + 1  # the defaults once
    expected = 6 + varied - 1  # the default-valued sensitivity run is Table 1's FedGMC Cora-10 run
    assert f"{expected} runs in the grid" in with_gmc.output
