"""`--batched` says which methods it cannot batch, and which can be is read from the registry, not kept by hand."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from gflbench.commands.app import app
from gflbench.core.method import all_methods
from gflbench.experiments.execute import per_client_fallbacks
from gflbench.experiments.spec import make_spec

GRID = ["run", "-d", "tiny", "--clients", "5", "--seeds", "1", "--rounds", "1"]


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("GFLBENCH_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("GFLBENCH_RESULTS", str(tmp_path / "runs.sqlite"))


def test_fallbacks_follow_each_methods_registration() -> None:
    """Every registered method: named as a fallback exactly when it does not declare `batchable` (at its
    default backbone), and a batchable method on a backbone without a batched network is named with it."""
    registered = all_methods()
    assert {m for m, cls in registered.items() if cls.batchable} and {
        m for m, c in registered.items() if not c.batchable
    }
    for name, cls in registered.items():
        named = per_client_fallbacks([make_spec(name, "cora", "metis", 10, 0)])
        assert named == ([] if cls.batchable else [name]), name
    assert per_client_fallbacks([make_spec("fedavg", "cora", "metis", 10, 0, {"backbone": "gamlp"})]) == [
        "fedavg (gamlp)"
    ]


def test_batched_names_the_methods_that_run_per_client(env) -> None:
    result = CliRunner().invoke(app, [*GRID, "-m", "fedavg,fedgta,adafgl", "--batched"])
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if "cannot be batched" in line]
    assert notes == ["--batched: fedgta, adafgl cannot be batched; their runs take the per-client path "
                     "(`gflbench methods` lists which methods can be)"]  # fmt: skip


def test_per_client_or_all_batchable_says_nothing(env) -> None:
    quiet = CliRunner().invoke(app, [*GRID, "-m", "fedgta"])  # not asked to batch
    batchable = CliRunner().invoke(app, [*GRID, "-m", "fedavg", "--batched"])
    assert quiet.exit_code == 0 and batchable.exit_code == 0, quiet.output + batchable.output
    assert "cannot be batched" not in quiet.output + batchable.output


def test_methods_lists_batchability_from_the_registry(env) -> None:
    result = CliRunner().invoke(app, ["methods"])
    assert result.exit_code == 0, result.output
    rows = {cells[0]: cells[3] for line in result.output.splitlines() if line.startswith("│")
            for cells in [[c.strip() for c in line.strip("│").split("│")]]}  # fmt: skip
    assert rows == {m: "yes" if cls.batchable else "no" for m, cls in all_methods().items()}


def test_batched_help_keeps_no_list_of_methods() -> None:
    """The help points at `gflbench methods` instead of naming methods, so it cannot drift from the registry."""
    text = CliRunner().invoke(app, ["run", "--help"], env={"TERMINAL_WIDTH": "400"}).output
    line = " ".join(text.split())
    assert "batchable method" in line and "gflbench methods" in line
    titles = [cls.title for cls in all_methods().values()]
    start = line.index("--batched")
    assert not [t for t in titles if t in line[start : start + 400]]


def test_force_batched_over_per_client_runs_keeps_both_and_the_table_shows_their_band(env, tmp_path) -> None:
    """`run --force --batched` on stored per-client runs stores the batched execution beside them; the table keeps
    reading the per-client seeds and adds their execution band; a second per-client --force replaces its own."""
    from gflbench.experiments.store import RunStore

    runner = CliRunner()
    run = [*GRID[:-1], "3", "-m", "fedavg", "--seeds", "2"]
    assert runner.invoke(app, run).exit_code == 0
    before = runner.invoke(app, ["table", "-d", "tiny", "-f", "csv", "--seeds", "2", "--rounds", "3"])
    assert before.exit_code == 0 and " exec " not in before.stdout and "exec X" not in before.stdout
    assert runner.invoke(app, [*run, "--batched", "--force"]).exit_code == 0
    assert runner.invoke(app, [*run, "--force"]).exit_code == 0  # the per-client execution again: replaced
    with RunStore(tmp_path / "runs.sqlite") as store:
        runs = store.frame(every_execution=True)
        records = store.records()
    assert [r["threads"] for r in records] == [1] * 4  # --threads (default 1), recorded
    # and which CPU computed them: its instruction set as torch dispatches on it, and a digest of model and flags
    cpus = {(r["cpu"]["capability"], r["cpu"]["digest"]) for r in records}
    assert len(cpus) == 1 and next(iter(cpus))[0] == torch.backends.cpu.get_cpu_capability().lower()
    cpu = "-".join(next(iter(cpus)))
    assert (
        sorted(runs["execution_key"])
        == [f"batched/dense/alone/cpu/{cpu}"] * 2 + [f"per-client/dense/alone/cpu/{cpu}"] * 2
    )
    after = runner.invoke(app, ["table", "-d", "tiny", "-f", "csv", "--seeds", "2", "--rounds", "3"])
    assert after.exit_code == 0, after.output
    header, fedavg = (row.split(",") for row in after.stdout.splitlines() if row.startswith(("Methods", "FedAvg")))
    column = header.index("Tiny 5 Clients")
    mean = fedavg[column].split(" · ")[0]
    assert mean == before.stdout.splitlines()[-1].split(",")[column].split(" · ")[0]  # the per-client seeds' cell
    assert " · exec " in fedavg[column] and float(fedavg[header.index("Tiny 5 Clients exec")]) >= 0
