"""Figures are written (PNG and PDF) from stored runs and snapshots, and refuse when there is nothing to draw."""

from __future__ import annotations

import pandas as pd
import torch
from typer.testing import CliRunner

from gflbench.commands.app import app
from gflbench.experiments.spec import make_spec
from gflbench.experiments.store import RunStore
from gflbench.paper import plots
from gflbench.paper.tables import Selection


def _put(runs: RunStore, method: str, seed: int, overrides: dict | None = None, test: float = 0.7) -> None:
    spec = make_spec(method, "cora", "metis", 10, seed, overrides or {}, rounds=5)
    runs.put({"run_key": spec.run_key, "config_key": spec.config_key, "method": method, "dataset": "cora",
              "scheme": "metis", "clients": 10, "data_seed": spec.data_seed, "seed": seed, "metric": "accuracy",
              "status": "ok", "test": test, "val": test, "finished_at": 0.0, "seconds_per_round": [0.1] * 5,
              "curves": {"test": [0.3, 0.5, 0.6, test, test], "val": [0.3, 0.5, 0.6, test, test]}})  # fmt: skip


def test_convergence_figure(tmp_path):
    store = tmp_path / "runs.sqlite"
    with RunStore(store) as runs:
        for seed in range(2):
            _put(runs, "fedavg", seed)
            _put(runs, "local", seed, test=0.8)
    out = tmp_path / "fig" / "conv"
    result = CliRunner().invoke(
        app, ["plot", "convergence", "-d", "cora", "--rounds", "5", "--store", str(store), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    for suffix in (".png", ".pdf"):
        assert (out.with_suffix(suffix)).stat().st_size > 1000
    empty = CliRunner().invoke(app, ["plot", "convergence", "-d", "citeseer", "--rounds", "5", "--store", str(store)])
    assert empty.exit_code == 2 and "no stored runs" in empty.stderr


def test_sensitivity_reads_one_at_a_time_variations(tmp_path):
    specs = plots.sensitivity_specs("cora", "metis", 10, seeds=2, rounds=5)
    # every value of every parameter, with the four defaults shared by one configuration
    assert len(specs) == 2 * (sum(len(v) for v in plots.SENSITIVITY.values()) - 3)
    assert len({s.run_key for s in specs}) == len(specs)
    assert {s.params.Q for s in specs if s.params.B == 64 and s.params.tau == 1.0 and s.params.eta == 0.1} >= {
        5,
        20,
        40,
    }
    rows = [{"run_key": s.run_key, "config_key": s.config_key, "method": "fedgmc", "dataset": "cora", "scheme": "metis",
             "clients": 10, "seed": s.seed, "status": "ok", "test": 0.8 + 0.001 * s.seed} for s in specs]  # fmt: skip
    written = plots.sensitivity(Selection(pd.DataFrame(rows), {}, 5), "cora", "metis", 10, tmp_path / "sens")
    assert [p.suffix for p in written] == [".png", ".pdf"] and all(p.stat().st_size > 1000 for p in written)


def test_case_study_figure(tmp_path):
    gen = torch.Generator().manual_seed(0)

    def snapshot() -> dict:
        return {
            "anchors": torch.randn(4, 8, generator=gen),
            "templates": torch.randn(5, 2, 8, generator=gen),
            "calibrated_means": torch.randn(3, 4, 8, generator=gen),
            "class_present": torch.ones(3, 4, dtype=torch.bool),
            "local_structural": [torch.randn(16, 2, 8, generator=gen) for _ in range(3)],
            "assignment": [torch.softmax(torch.randn(16, 5, generator=gen), 1) for _ in range(3)],
        }  # fmt: skip

    written = plots.case_study(snapshot(), snapshot(), "synthetic", tmp_path / "case")
    assert all(p.exists() and p.stat().st_size > 1000 for p in written)
