"""`gflbench tune`: the `fair` protocol's studies (gfl_bench/experiments/tune.py), with their progress."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from gflbench.commands.common import (
    DataDirOption,
    DatasetsOption,
    DeviceOption,
    EpochsOption,
    MethodsOption,
    PartitionFileOption,
    PartitionOption,
    RoundsOption,
    SchemeAlphaOption,
    StoreOption,
    ThreadsOption,
    TunedOption,
    _partition_file_at_default_seed,
    _progress,
    console,
    err_console,
    friendly,
    parse_ints,
    split_list,
)
from gflbench.data import default_data_dir
from gflbench.errors import UserError
from gflbench.experiments.store import DEFAULT_STORE


@friendly
def tune(
    method: MethodsOption,
    dataset: DatasetsOption,
    partition: PartitionOption = "metis",
    alpha: SchemeAlphaOption = None,
    partition_file: PartitionFileOption = None,
    clients: Annotated[str, typer.Option(help="Client counts, comma-separated.")] = "10",
    trials: Annotated[int, typer.Option(help="Trials per method and setting: the same budget for every method.")] = 16,
    tuning_seeds: Annotated[int, typer.Option(help="Seeds per trial (1000, 1001, ...; never a reporting seed).")] = 1,
    prune: Annotated[
        bool, typer.Option(help="Stop trials below the median of earlier ones (Optuna MedianPruner).")
    ] = True,
    rounds: RoundsOption = None,
    local_epochs: EpochsOption = None,
    device: DeviceOption = "auto",
    threads: ThreadsOption = 1,
    tuned_dir: TunedOption = None,
    data_dir: DataDirOption = None,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Choose each method's hyperparameters on validation (Optuna), for `--protocol fair`; resumable after a kill."""
    import torch

    from gflbench.data.partition import DEFAULT_DATA_SEED, check_clients, scheme_label
    from gflbench.experiments.protocol import tuned_dir as resolve_tuned
    from gflbench.experiments.runner import DataCache, check_measurable, resolve_device
    from gflbench.experiments.spec import make_spec
    from gflbench.experiments.tune import Budget, TuneInterrupted

    methods = split_list(method, "methods")
    datasets = split_list(dataset, "datasets")
    partition = scheme_label(partition, alpha)
    if partition_file is not None:
        partition, counts = _partition_file_at_default_seed(partition_file, datasets, None, data_dir)
    else:
        counts = parse_ints(clients, "client counts")
    budget = Budget(trials, tuning_seeds, prune, rounds, local_epochs)
    settings = [(d, m) for d in datasets for m in counts]
    for d, m in settings:
        check_clients(partition, m)
        for meth in methods:
            make_spec(meth, d, partition, m, 0, None, rounds, local_epochs)  # bad names fail before any work
    if threads < 0:
        raise UserError("--threads must be 0 or more")
    if threads:
        torch.set_num_threads(threads)
    chosen_device = resolve_device(device)
    root = data_dir or default_data_dir()
    cache = DataCache(root, root / "partitions")
    for d, m in settings:  # as `run`: a missing dataset, an impossible or unmeasurable partition, before any trial
        check_measurable(cache.federated(d, partition, m, DEFAULT_DATA_SEED))
    folder = resolve_tuned(tuned_dir)
    storage = Path(store).with_name("tuning.sqlite")
    try:
        _tune_settings(settings, methods, partition, budget, cache, chosen_device, storage, folder)
    except KeyboardInterrupt as stop:  # one line, as `run` closes: what stopped, and the command that resumes it
        where = "before a study started"
        if isinstance(stop, TuneInterrupted):
            rerun = "" if stop.trial is None else f", trial {stop.trial} stopped (its values run first)"
            where = f"study {stop.study} at {stop.finished}/{stop.total} finished trials{rerun}"
        resume = _tune_command(method, dataset, partition, clients, trials, tuning_seeds, prune, rounds, local_epochs,
                               device, threads, tuned_dir, data_dir, store)  # fmt: skip
        err_console.print(f"interrupted: {where}; every finished trial is stored; resume with: {resume}",
                          markup=False, highlight=False, soft_wrap=True)  # fmt: skip
        raise typer.Exit(130) from None


def _tune_settings(settings: list[tuple[str, int]], methods: list[str], partition: str, budget: Any, cache: Any,
                   chosen_device: Any, storage: Path, folder: Path) -> None:  # fmt: skip
    """`tune`'s studies, setting by setting: a bar or one line per finished trial, a line per chosen configuration."""
    from gflbench.data.partition import DEFAULT_DATA_SEED
    from gflbench.experiments.protocol import tuned_file
    from gflbench.experiments.tune import TrialReport
    from gflbench.experiments.tune import tune as tune_method

    for d, m in settings:
        data = cache.federated(d, partition, m, DEFAULT_DATA_SEED)
        for meth in methods:
            what = f"{meth} {d} {partition}-{m}"
            # a bar in a terminal; piped or redirected, one plain line per finished trial
            with _progress() if console.is_terminal else contextlib.nullcontext() as progress:
                task = progress.add_task(f"tune {what}", total=budget.trials, status="") if progress else 0

                def shown(report: TrialReport, task: int = task, what: str = what, progress=progress) -> None:
                    value = "—" if report.value is None else f"{report.value * 100:.2f}"
                    line = (
                        f"trial {report.number + 1}/{report.total} {report.state}: val {value} ({report.seconds:.0f} s)"
                    )
                    if progress is not None:
                        progress.update(task, completed=report.number + 1, status=line)
                    else:
                        sys.stdout.write(f"{what} {line} {json.dumps(report.values, sort_keys=True)}\n")
                        sys.stdout.flush()

                entry = tune_method(meth, d, partition, m, budget, data, chosen_device, storage, folder, shown)
            values = " ".join(
                f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in entry["values"].items()
            )
            console.print(f"{what}: best validation {entry['validation'] * 100:.2f} (trial {entry['trial']}; "
                          f"{entry['trials']['complete']} complete, {entry['trials']['pruned']} pruned): {values}",
                          soft_wrap=True)  # fmt: skip
        console.print(f"wrote {tuned_file(folder, d, partition, m)}", soft_wrap=True)


def _tune_command(method: str, dataset: str, partition: str, clients: str, trials: int, tuning_seeds: int, prune: bool,
                  rounds: int | None, local_epochs: int | None, device: str, threads: int, tuned_dir: Path | None,
                  data_dir: Path | None, store: Path) -> str:  # fmt: skip
    """The `gflbench tune` command line that continues these studies: every option that names them or their files."""
    import shlex

    words = ["gflbench", "tune", "--method", method, "--dataset", dataset, "--partition", partition, "--clients", clients,
             "--trials", str(trials), "--tuning-seeds", str(tuning_seeds), "--prune" if prune else "--no-prune"]  # fmt: skip
    optional = {"--rounds": rounds, "--local-epochs": local_epochs, "--tuned-dir": tuned_dir, "--data-dir": data_dir}
    words += [w for option, value in optional.items() if value is not None for w in (option, str(value))]
    words += ["--device", device, "--threads", str(threads), "--store", str(store)]
    return shlex.join(words)
