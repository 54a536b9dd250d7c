"""`gflbench tune`: choose each method's hyperparameters on validation, with one budget for all (`fair`).

For one method in one setting (dataset, scheme, client count), Optuna's TPE sampler proposes values
from the method's declared `Params.search_space`; a trial runs the method with those values on top of
its `paper` configuration, on the tuning seeds (1000, 1001, ...: disjoint from the reporting seeds
0..9), and scores the mean best-round client-mean validation value. Test values are never looked at.
With the pruner on, a trial whose running-best validation after a quarter of the rounds is below the
median of earlier trials at the same round stops early (Optuna's MedianPruner, first tuning seed).

The study lives in an Optuna SQLite file beside the run store, so a killed `tune` resumes: trials
that were running when the process died are marked failed and their values queued again, and only
the missing trials of the budget run. The chosen values go to the setting's reviewable JSON file
(gfl_bench/protocol.py), which `run --protocol fair` reads.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gfl_bench.errors import UserError
from gfl_bench.method import Space, method_class
from gfl_bench.protocol import write_tuned
from gfl_bench.runner import FederatedData, RunFailed, run
from gfl_bench.spec import HARNESS_VERSION, make_spec

TUNING_SEED_BASE = 1000  # tuning seeds are 1000, 1001, ...; reporting seeds are 0..9
SAMPLER_SEED = 0
STARTUP_TRIALS = 4  # trials the pruner never stops: the median needs a basis


@dataclass(frozen=True)
class Budget:
    """The effort every method gets: the same for all methods of one `fair` comparison."""

    trials: int = 16
    seeds: int = 1
    prune: bool = True
    rounds: int | None = None  # None: the dataset's schedule
    local_epochs: int | None = None

    def __post_init__(self) -> None:
        if self.trials < 1 or self.seeds < 1:
            raise UserError(f"tune needs at least 1 trial and 1 tuning seed, got {self.trials} and {self.seeds}")

    @property
    def tuning_seeds(self) -> list[int]:
        return [TUNING_SEED_BASE + i for i in range(self.seeds)]


@dataclass(frozen=True)
class TrialReport:
    """What a caller shows per finished trial."""

    method: str
    number: int  # 0-based within the study
    total: int
    state: str  # complete, pruned, failed
    value: float | None
    values: Mapping[str, Any]
    seconds: float


def study_name(method: str, dataset: str, scheme: str, clients: int, budget: Budget, rounds: int, epochs: int) -> str:
    """Everything that makes two studies comparable; the trial count is not in it, so a larger budget continues."""
    space = {k: asdict(v) for k, v in method_class(method).Params.search_space.items()}
    digest = hashlib.sha256(json.dumps(space, sort_keys=True).encode()).hexdigest()[:8]
    return (f"{method}|{dataset}|{scheme}-{clients}|r{rounds}e{epochs}|seeds{budget.seeds}|"
            f"{'median' if budget.prune else 'noprune'}|space-{digest}|h{HARNESS_VERSION}")  # fmt: skip


def suggest(trial: Any, space: Mapping[str, Space]) -> dict[str, Any]:
    """One value per searched key, drawn through the trial (Optuna distributions by Space.kind)."""
    values: dict[str, Any] = {}
    for key, s in space.items():
        if s.kind == "log":
            values[key] = trial.suggest_float(key, s.low, s.high, log=True)
        elif s.kind == "float":
            values[key] = trial.suggest_float(key, s.low, s.high)
        elif s.kind == "int":
            values[key] = trial.suggest_int(key, int(s.low), int(s.high))
        elif s.kind == "choice":
            values[key] = trial.suggest_categorical(key, list(s.choices))
        else:
            raise ValueError(f"unknown search-space kind {s.kind!r} for {key}")
    return values


@contextlib.contextmanager
def exclusive(path: Path, what: str) -> Iterator[None]:
    """Hold an OS lock on `path` (released by the kernel when the process dies, even by kill -9)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"another `gflbench tune` is tuning {what} (lock {path}); wait for it") from None
        yield


def tune(
    method: str,
    dataset: str,
    scheme: str,
    clients: int,
    budget: Budget,
    data: FederatedData,
    device: Any,
    storage_path: Path,
    tuned_folder: Path,
    on_trial: Callable[[TrialReport], None] = lambda report: None,
) -> dict[str, Any]:
    """Run the missing trials of one study, write the best values to the tuned file, return its entry."""
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cls = method_class(method)
    probe = make_spec(method, dataset, scheme, clients, 0, None, budget.rounds, budget.local_epochs, shared_schedule=True)
    name = study_name(method, dataset, scheme, clients, budget, probe.rounds, probe.local_epochs)
    url = f"sqlite:///{Path(storage_path).resolve()}"
    lock = Path(storage_path).with_name(Path(storage_path).name + f".{hashlib.sha256(name.encode()).hexdigest()[:12]}.lock")
    with exclusive(lock, f"{method} on {dataset} {scheme}-{clients}"):
        storage = optuna.storages.RDBStorage(url)
        pruner = (optuna.pruners.MedianPruner(n_startup_trials=STARTUP_TRIALS, n_warmup_steps=probe.rounds // 4)
                  if budget.prune else optuna.pruners.NopPruner())  # fmt: skip
        study = optuna.create_study(study_name=name, storage=storage, direction="maximize", load_if_exists=True,
                                    sampler=optuna.samplers.TPESampler(seed=SAMPLER_SEED), pruner=pruner)  # fmt: skip
        _requeue_interrupted(study, storage, name)

        def objective(trial: Any) -> float:
            values = suggest(trial, cls.Params.search_space)
            overrides = {k: str(v) for k, v in values.items()}
            scores = []
            for index, seed in enumerate(budget.tuning_seeds):
                spec = make_spec(method, dataset, scheme, clients, seed, overrides, budget.rounds, budget.local_epochs,
                                 shared_schedule=True)  # `fair` runs every method at the dataset's schedule
                best = [float("-inf")]

                def on_round(r: int, val: float, test: float, index: int = index, best: list = best) -> None:
                    best[0] = max(best[0], val)
                    if index == 0 and budget.prune:
                        trial.report(best[0], r)
                        if trial.should_prune():
                            raise optuna.TrialPruned()

                try:
                    scores.append(run(spec, data, device, on_round)["val"])
                except RunFailed:
                    trial.set_user_attr("failed", f"seed {seed} diverged")
                    scores.append(0.0)  # diverged: the worst validation value, so the sampler avoids the region
            return sum(scores) / len(scores)

        finished = (TrialState.COMPLETE, TrialState.PRUNED)
        done = len(study.get_trials(deepcopy=False, states=finished))
        states = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned", TrialState.FAIL: "failed"}

        def report(study: Any, trial: Any) -> None:
            seconds = (trial.datetime_complete - trial.datetime_start).total_seconds() if trial.datetime_complete else 0.0
            count = len(study.get_trials(deepcopy=False, states=finished))
            on_trial(TrialReport(method, count - 1, budget.trials, states.get(trial.state, str(trial.state)),
                                 trial.value, trial.params, seconds))  # fmt: skip

        if done < budget.trials:
            study.optimize(objective, n_trials=budget.trials - done, callbacks=[report], catch=())
        return _write_entry(study, cls.Params.search_space, budget, probe, name, storage_path, tuned_folder)


def _requeue_interrupted(study: Any, storage: Any, name: str) -> None:
    """Trials left RUNNING by a killed process: mark them failed and queue their values again."""
    from optuna.trial import TrialState

    study_id = storage.get_study_id_from_name(name)
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
        storage.set_trial_state_values(trial_id, TrialState.FAIL)
        if trial.params:
            study.enqueue_trial(trial.params, skip_if_exists=True)


def _write_entry(study: Any, space: Mapping[str, Space], budget: Budget, probe: Any, name: str,
                 storage_path: Path, tuned_folder: Path) -> dict[str, Any]:  # fmt: skip
    from optuna.trial import TrialState

    # The budget is a prefix of the study: with a smaller --trials than a study already ran, the entry
    # is what that smaller budget would have chosen (TPE and the pruner only look at earlier trials).
    ordered = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    finished = [t for t in ordered if t.state in (TrialState.COMPLETE, TrialState.PRUNED)][: budget.trials]
    last = finished[-1].number if finished else -1
    trials = [t for t in ordered if t.number <= last]
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if not complete:
        raise UserError(f"study {name} has no completed trial; run `gflbench tune` again with more --trials")
    best = max(complete, key=lambda t: (t.value, -t.number))
    seconds = sum((t.datetime_complete - t.datetime_start).total_seconds() for t in trials
                  if t.datetime_complete and t.datetime_start)  # fmt: skip
    entry = {
        "values": dict(best.params),
        "validation": best.value,
        "trial": best.number,
        "budget": {"trials": budget.trials, "tuning_seeds": budget.tuning_seeds,
                   "pruner": "median" if budget.prune else "none", "rounds": probe.rounds,
                   "local_epochs": probe.local_epochs, "sampler": f"TPE(seed={SAMPLER_SEED})"},  # fmt: skip
        "trials": {state: sum(1 for t in trials if t.state == getattr(TrialState, state.upper()))
                   for state in ("complete", "pruned", "fail")},  # fmt: skip
        "trial_seconds": round(seconds, 1),
        "search_space": {k: v.describe() for k, v in space.items()},
        "objective": "mean best-round client-mean validation over the tuning seeds",
        "study": name,
        "storage": str(storage_path),
        "tuned_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_tuned(tuned_folder, probe.dataset, probe.scheme, probe.clients, probe.method, entry)
    return entry
