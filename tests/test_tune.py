"""`gflbench tune`: a study extended, interrupted (Ctrl-C, kill -9) and resumed runs the same trials
as one that ran in a single process, an interrupted trial reruns exactly once, and Ctrl-C closes with
one line naming the study and the command that resumes it."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
from typer.testing import CliRunner

import gflbench.experiments.tune as tune_module
from gflbench.commands.app import app
from gflbench.experiments.runner import FederatedData
from gflbench.experiments.tune import RERUN_OF, Budget, TuneInterrupted, tune

ROUNDS = 12  # 1-3 s a trial on tiny; the pruner (on) may stop a trial from round 3 once 4 trials completed
CLI = ["-m", "fedavg", "-d", "tiny", "--clients", "5", "--rounds", str(ROUNDS), "--device", "cpu"]
Finished = list[tuple[str, dict[str, Any], float]]


def _trials(storage: Path) -> list[optuna.trial.FrozenTrial]:
    url = f"sqlite:///{storage}"
    (name,) = optuna.get_all_study_names(url)
    return sorted(optuna.load_study(study_name=name, storage=url).get_trials(), key=lambda t: t.number)


def _finished(storage: Path) -> Finished:
    """The finished trials in order: what the budget counts and the sampler and pruner read."""
    return [(t.state.name, t.params, t.value) for t in _trials(storage) if t.state.name in ("COMPLETE", "PRUNED")]


def _tune(data: FederatedData, folder: Path, trials: int) -> dict[str, Any]:
    budget = Budget(trials=trials, rounds=ROUNDS)
    return tune(
        "fedavg", "tiny", "metis", 5, budget, data, torch.device("cpu"), folder / "tuning.sqlite", folder / "tuned"
    )


@pytest.fixture(scope="module")
def uninterrupted(tiny_federation: FederatedData, tmp_path_factory: pytest.TempPathFactory) -> Finished:
    """The 6-trial study run in one go: what every other way of reaching 6 trials must equal."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    _tune(tiny_federation, folder, 6)
    finished = _finished(folder / "tuning.sqlite")
    assert len(finished) == 6
    assert len({json.dumps(params, sort_keys=True) for _, params, _ in finished}) == 6  # six distinct proposals
    return finished


def _stopping_run(trial: int, at_round: int) -> Callable[..., dict[str, Any]]:
    """The runner, but Ctrl-C arrives at `at_round` of the `trial`-th run (one tuning seed: one run a trial)."""
    real, calls = tune_module.run, []

    def stopping(spec: Any, data: FederatedData, device: Any, on_round: Callable[[int, float, float], None]) -> Any:
        calls.append(spec)

        def round_done(r: int, val: float, test: float) -> None:
            on_round(r, val, test)
            if len(calls) == trial + 1 and r == at_round:
                raise KeyboardInterrupt

        return real(spec, data, device, round_done)

    return stopping


# `gflbench tune` in a process of its own whose third trial holds at round 5 (after touching argv[1]),
# so the test kills it mid-trial at a known point whatever the machine's speed.
HOLD_THIRD_TRIAL = """
import sys, time
import gflbench.experiments.tune as tune_module
held, real, calls = sys.argv[1], tune_module.run, []
def run(spec, data, device, on_round):
    calls.append(spec)
    def round_done(r, val, test):
        on_round(r, val, test)
        if len(calls) == 3 and r == 5:
            open(held, "w").close()
            time.sleep(3600)
    return real(spec, data, device, round_done)
tune_module.run = run
from gflbench.commands.app import app
sys.argv = ["gflbench", *sys.argv[2:]]
app()
"""


def _assert_rerun_once(storage: Path, failed: int) -> None:
    """Trial `failed` did not finish; the next trial ran its values, and no other trial did."""
    trials = _trials(storage)
    assert trials[failed].state.name == "FAIL" and trials[failed].params
    reruns = [t for t in trials if t.user_attrs.get(RERUN_OF) == failed]
    assert [t.number for t in reruns] == [failed + 1]
    assert reruns[0].params == trials[failed].params and reruns[0].state.name in ("COMPLETE", "PRUNED")
    assert [t.state.name for t in trials].count("FAIL") == 1 and all(t.state.is_finished() for t in trials)


def test_an_extended_study_continues_the_sampler(tiny_federation, uninterrupted, tmp_path):
    """3 trials, then --trials 6: trials 3-5 are new proposals, the same as a 6-trial study's (they used to
    repeat trials 0-2: one sampler seeded once per process replayed its start-up draws)."""
    _tune(tiny_federation, tmp_path, 3)
    assert _finished(tmp_path / "tuning.sqlite") == uninterrupted[:3]
    entry = _tune(tiny_federation, tmp_path, 6)
    assert _finished(tmp_path / "tuning.sqlite") == uninterrupted
    assert entry["trials"]["complete"] + entry["trials"]["pruned"] == 6 and entry["trials"]["fail"] == 0
    assert "per-trial reseed" in entry["budget"]["sampler"] and "first 10 trials random" in entry["budget"]["sampler"]


def test_ctrl_c_mid_trial_then_resume_equals_one_uninterrupted_study(
    tiny_federation, uninterrupted, tmp_path, monkeypatch
):
    storage = tmp_path / "tuning.sqlite"
    monkeypatch.setattr(tune_module, "run", _stopping_run(trial=3, at_round=5))
    with pytest.raises(TuneInterrupted) as stopped:
        _tune(tiny_federation, tmp_path, 6)
    assert (stopped.value.finished, stopped.value.total, stopped.value.trial) == (3, 6, 3)
    assert stopped.value.study.startswith("fedavg|tiny|metis-5|")
    assert [t.state.name for t in _trials(storage)] == ["COMPLETE"] * 3 + ["FAIL"]
    assert not (tmp_path / "tuned" / "tiny-metis-5.json").exists()
    monkeypatch.undo()

    entry = _tune(tiny_federation, tmp_path, 6)
    assert _finished(storage) == uninterrupted
    _assert_rerun_once(storage, failed=3)
    assert entry["trials"]["fail"] == 1 and entry["trials"]["complete"] + entry["trials"]["pruned"] == 6
    again = _tune(tiny_federation, tmp_path, 6)  # a finished study: no trial queued or run again
    assert len(_trials(storage)) == 7 and again["values"] == entry["values"]


def test_kill_9_mid_trial_then_resume_equals_one_uninterrupted_study(uninterrupted, tmp_path):
    """A process killed mid-trial leaves the trial RUNNING; the next start fails it and reruns its values once."""
    storage, held = tmp_path / "tuning.sqlite", tmp_path / "held"
    args = [
        "tune",
        *CLI,
        "--trials",
        "6",
        "--store",
        str(tmp_path / "runs.sqlite"),
        "--tuned-dir",
        str(tmp_path / "tuned"),
    ]
    env = {**os.environ, "GFLBENCH_DATA": str(tmp_path / "data")}
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, "-c", HOLD_THIRD_TRIAL, str(held), *args], env=env, cwd=root,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.time() + 300
        while not held.exists():
            assert proc.poll() is None, proc.stdout.read()
            assert time.time() < deadline, "the third trial did not start within 300 s"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert [t.state.name for t in _trials(storage)] == ["COMPLETE", "COMPLETE", "RUNNING"]

    resumed = CliRunner().invoke(app, args, env={"GFLBENCH_DATA": str(tmp_path / "data")})
    assert resumed.exit_code == 0, resumed.output
    assert _finished(storage) == uninterrupted
    _assert_rerun_once(storage, failed=2)


def test_ctrl_c_through_the_cli_is_one_line_and_its_command_resumes(uninterrupted, tmp_path, monkeypatch):
    for name, value in (("GFLBENCH_DATA", "data"), ("GFLBENCH_RESULTS", "runs.sqlite"), ("GFLBENCH_TUNED", "tuned")):
        monkeypatch.setenv(name, str(tmp_path / value))
    runner = CliRunner()
    with monkeypatch.context() as patch:
        patch.setattr(tune_module, "run", _stopping_run(trial=2, at_round=4))
        stopped = runner.invoke(app, ["tune", *CLI, "--trials", "6"])
    assert stopped.exit_code == 130, stopped.output  # as `run` exits on Ctrl-C
    lines = [line for line in stopped.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stopped.stderr
    (line,) = lines
    assert line.startswith("interrupted: study fedavg|tiny|metis-5|") and "at 2/6 finished trials" in line
    assert "trial 2 stopped" in line and "resume with: gflbench tune --method fedavg --dataset tiny" in line

    command = shlex.split(line.split("resume with: ", 1)[1])
    assert command[:2] == ["gflbench", "tune"]
    resumed = runner.invoke(app, command[1:])
    assert resumed.exit_code == 0, resumed.output
    storage = tmp_path / "tuning.sqlite"
    assert _finished(storage) == uninterrupted
    _assert_rerun_once(storage, failed=2)
