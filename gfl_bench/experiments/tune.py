"""`gflbench tune`: choose each method's hyperparameters on validation, with one budget for all (`fair`).

For one method in one setting (dataset, scheme, client count), Optuna's TPE sampler proposes values
from the method's declared `Params.search_space`; a trial runs the method with those values on top of
its `paper` configuration, on the tuning seeds (1000, 1001, ...: disjoint from the reporting seeds
0..9), and scores the mean best-round client-mean validation value. Test values are never looked at.
With the pruner on, a trial whose running-best validation after a quarter of the rounds is below the
median of earlier trials at the same round stops early (Optuna's MedianPruner, first tuning seed).

The study lives in an Optuna SQLite file beside the run store, so a stopped `tune` resumes and a
larger budget extends it: a trial a dead process left running is marked failed, each failed trial's
values are queued once (they run next; a failed trial never counts toward the budget), and only the
missing trials run. Before each trial a new TPE sampler is seeded from SAMPLER_SEED and the number of
finished trials, so the trials depend on the finished ones only, not on how many processes ran them:
a study run in pieces equals one run in one go. TPE's first 10 trials are its random start-up, so a
budget of up to 10 trials is a seeded random search. The chosen values go to the setting's reviewable
JSON file (gfl_bench/experiments/protocol.py), which `run --protocol fair` reads.
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

from gflbench.core.method import Space, method_class
from gflbench.errors import UserError
from gflbench.experiments.protocol import write_tuned
from gflbench.experiments.runner import FederatedData, RunFailed, run
from gflbench.experiments.spec import HARNESS_VERSION, make_spec

TUNING_SEED_BASE = 1000  # tuning seeds are 1000, 1001, ...; reporting seeds are 0..9
SAMPLER_SEED = 0  # the study's seed; each trial's sampler is seeded from it and the finished-trial count
TPE_STARTUP_TRIALS = 10  # Optuna's default, named so the tuned entry states it: below it TPE draws at random
PRUNER_STARTUP_TRIALS = 4  # trials the pruner never stops: the median needs a basis
SAMPLER_SCHEME = "tpe-reseed"  # in the study name: studies of the one-seed-per-process sampler are not continued
SAMPLER = (
    f"TPE(seed={SAMPLER_SEED}, per-trial reseed from the seed and the finished-trial count), "
    f"first {TPE_STARTUP_TRIALS} trials random start-up"
)  # in the tuned entry's budget
RERUN_OF = "rerun_of"  # user attribute of a trial queued for a failed one: that trial's number


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


class TuneInterrupted(KeyboardInterrupt):
    """Ctrl-C during a study: which study, how far it got and which trial it stopped (None: between trials)."""

    def __init__(self, study: str, finished: int, total: int, trial: int | None) -> None:
        super().__init__(study)
        self.study, self.finished, self.total, self.trial = study, finished, total, trial


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
            f"{'median' if budget.prune else 'noprune'}|space-{digest}|{SAMPLER_SCHEME}|h{HARNESS_VERSION}")  # fmt: skip


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
    """Run the missing trials of one study, write the best values to the tuned file, return its entry.

    Ctrl-C raises `TuneInterrupted` (a KeyboardInterrupt naming the study) after marking the running
    trial failed; the next start queues its values again, so nothing finished is lost or repeated.
    """
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cls = method_class(method)
    probe = make_spec(
        method, dataset, scheme, clients, 0, None, budget.rounds, budget.local_epochs, shared_schedule=True
    )
    name = study_name(method, dataset, scheme, clients, budget, probe.rounds, probe.local_epochs)
    url = f"sqlite:///{Path(storage_path).resolve()}"
    lock = Path(storage_path).with_name(
        Path(storage_path).name + f".{hashlib.sha256(name.encode()).hexdigest()[:12]}.lock"
    )
    with exclusive(lock, f"{method} on {dataset} {scheme}-{clients}"):
        storage = optuna.storages.RDBStorage(url)
        pruner = (optuna.pruners.MedianPruner(n_startup_trials=PRUNER_STARTUP_TRIALS, n_warmup_steps=probe.rounds // 4)
                  if budget.prune else optuna.pruners.NopPruner())  # fmt: skip

        def objective(trial: Any) -> float:
            values = suggest(trial, cls.Params.search_space)
            overrides = {k: str(v) for k, v in values.items()}
            scores = []
            for index, seed in enumerate(budget.tuning_seeds):
                spec = make_spec(
                    method,
                    dataset,
                    scheme,
                    clients,
                    seed,
                    overrides,
                    budget.rounds,
                    budget.local_epochs,
                    shared_schedule=True,
                )  # `fair` runs every method at the dataset's schedule
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

        states = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned"}
        done, running = 0, None
        try:
            study = optuna.create_study(study_name=name, storage=storage, direction="maximize", load_if_exists=True,
                                        sampler=trial_sampler(0), pruner=pruner)  # fmt: skip
            _rerun_interrupted(study)
            done = _finished(study)
            while done < budget.trials:
                # A fresh sampler per trial, seeded by how many trials have finished: what it proposes depends on
                # the finished trials and that count only, never on how many processes the study took.
                study = optuna.load_study(study_name=name, storage=storage, sampler=trial_sampler(done), pruner=pruner)
                trial = study.ask()  # an interrupted trial's queued values first
                running = trial.number
                try:
                    value = objective(trial)
                except optuna.TrialPruned:
                    frozen = study.tell(trial, state=TrialState.PRUNED)
                except BaseException as error:  # Ctrl-C or a bug: failed, its values rerun at the next start
                    trial.set_user_attr("stopped_by", type(error).__name__)
                    study.tell(trial, state=TrialState.FAIL)
                    raise
                else:
                    frozen = study.tell(trial, value)
                done, running = done + 1, None
                seconds = (frozen.datetime_complete - frozen.datetime_start).total_seconds()
                on_trial(TrialReport(method, done - 1, budget.trials, states[frozen.state], frozen.value, frozen.params,
                                     seconds))  # fmt: skip
        except KeyboardInterrupt as interrupt:
            raise TuneInterrupted(name, done, budget.trials, running) from interrupt
        return _write_entry(study, cls.Params.search_space, budget, probe, name, storage_path, tuned_folder)


def trial_sampler(finished: int) -> Any:
    """TPE for the trial that follows `finished` finished (complete or pruned) trials.

    Seeded from the study's fixed seed and that count, never from the sampler's own running state: a
    sampler built once per process with one seed replays its first draws whenever a study is resumed or
    extended (trials 3-5 of a 3-then-6 study repeated trials 0-2). Given the finished trials, which TPE
    and the median pruner read (failed ones they skip), the next trial's values are then the same
    whether the study ran in one process or several.
    """
    import numpy as np
    import optuna

    seed = int(np.random.SeedSequence([SAMPLER_SEED, finished]).generate_state(1)[0])
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=TPE_STARTUP_TRIALS)


def _finished(study: Any) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def _rerun_interrupted(study: Any) -> None:
    """Mark trials a dead process left RUNNING failed, and queue each failed trial's values once.

    Only one process holds a study (`exclusive`), so a RUNNING trial at the start is one whose process
    died (kill -9, SIGTERM, a crash). A failed trial (those, and one stopped by Ctrl-C or a bug) is
    queued again unless a trial already names it in `RERUN_OF`, so its values run next, exactly once
    per failure. It does not count toward the budget, and TPE and the pruner skip it.
    """
    from optuna.trial import TrialState

    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(trial.number, state=TrialState.FAIL)
    trials = study.get_trials(deepcopy=False)
    rerun = {t.user_attrs[RERUN_OF] for t in trials if RERUN_OF in t.user_attrs}
    for trial in trials:
        if trial.state == TrialState.FAIL and trial.params and trial.number not in rerun:
            study.enqueue_trial(trial.params, user_attrs={RERUN_OF: trial.number})


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
        "budget": {
            "trials": budget.trials,
            "tuning_seeds": budget.tuning_seeds,
            "pruner": "median" if budget.prune else "none",
            "rounds": probe.rounds,
            "local_epochs": probe.local_epochs,
            "sampler": SAMPLER,
        },
        "trials": {
            state: sum(1 for t in trials if t.state == getattr(TrialState, state.upper()))
            for state in ("complete", "pruned", "fail")
        },
        "trial_seconds": round(seconds, 1),
        "search_space": {k: v.describe() for k, v in space.items()},
        "objective": "mean best-round client-mean validation over the tuning seeds",
        "study": name,
        "storage": str(storage_path),
        "tuned_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_tuned(tuned_folder, probe.dataset, probe.scheme, probe.clients, probe.method, entry)
    return entry
