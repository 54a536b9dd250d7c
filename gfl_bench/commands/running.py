"""`gflbench run`, `sweep` and `failed`: planning the runs (gfl_bench/paper/planning.py), executing them
(gfl_bench/experiments/execute.py) and saying what happened.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from gflbench.commands.common import (
    BatchedOption,
    DataDirOption,
    DataSeedOption,
    DatasetsOption,
    DeviceOption,
    EpochsOption,
    MethodsOption,
    ParticipationOption,
    PartitionFileOption,
    PartitionOption,
    ProtocolOption,
    RetryOption,
    RoundsOption,
    RunSeedsOption,
    SchemeAlphaOption,
    SelectionOption,
    SetOption,
    SparseOption,
    StackOption,
    StoreOption,
    ThreadsOption,
    TunedOption,
    WorkersOption,
    _check_parallel,
    _check_rule,
    _duration,
    _label,
    _partition_file,
    _partition_file_at_default_seed,
    _progress,
    _say,
    console,
    err_console,
    friendly,
    parse_ints,
    split_list,
)
from gflbench.data import default_data_dir
from gflbench.errors import UserError
from gflbench.experiments.protocol import DEFAULT_PROTOCOL, check_protocol
from gflbench.experiments.store import DEFAULT_STORE, RunStore

if TYPE_CHECKING:  # names for annotations only: importing them here would load torch for `--help`
    from gflbench.experiments.execute import Environment
    from gflbench.experiments.spec import RunSpec


@friendly
def run(
    method: MethodsOption,
    dataset: DatasetsOption,
    partition: PartitionOption = "metis",
    alpha: SchemeAlphaOption = None,
    partition_file: PartitionFileOption = None,
    clients: Annotated[
        str | None, typer.Option(help="Client counts, comma-separated; default the paper's for the scheme.")
    ] = None,
    participation: ParticipationOption = 1.0,
    seeds: RunSeedsOption = 10,
    device: DeviceOption = "auto",
    threads: ThreadsOption = 1,
    workers: WorkersOption = 1,
    batched: BatchedOption = False,
    stack_seeds: StackOption = 1,
    sparse_features: SparseOption = False,
    set_: SetOption = None,
    rounds: RoundsOption = None,
    local_epochs: EpochsOption = None,
    protocol: ProtocolOption = DEFAULT_PROTOCOL,
    tuned_dir: TunedOption = None,
    selection: SelectionOption = "global",
    data_seed: DataSeedOption = None,
    data_dir: DataDirOption = None,
    store: StoreOption = DEFAULT_STORE,
    force: Annotated[
        bool,
        typer.Option(
            help="Recompute runs that are already stored. A record of the same execution is replaced; one of "
            "another (e.g. --batched over per-client runs) is stored beside it, for `table`'s execution band."
        ),
    ] = False,
    retry_failed: RetryOption = False,
    snapshot_rounds: Annotated[
        str, typer.Option(help="Rounds at which to save the server's snapshot (e.g. FedGMC manifolds).")
    ] = "",
    snapshot_dir: Annotated[Path, typer.Option(help="Folder for snapshots.")] = Path("results") / "snapshots",
) -> None:
    """Train methods on datasets over the paper's partitions and seeds; store every finished run."""
    from gflbench.data.partition import DEFAULT_DATA_SEED, check_clients, default_clients, scheme_label
    from gflbench.experiments.execute import Environment
    from gflbench.experiments.spec import make_spec
    from gflbench.paper import planning

    data_seed = DEFAULT_DATA_SEED if data_seed is None else data_seed  # its value lives with the partitions
    check_protocol(protocol)
    _check_rule(selection)
    methods = split_list(method, "methods")
    datasets = split_list(dataset, "datasets")
    partition = scheme_label(partition, alpha)
    if partition_file is not None:
        partition, counts, data_seed = _partition_file(partition_file, datasets, clients, data_dir)
    else:
        counts = parse_ints(clients, "client counts") if clients else list(default_clients(partition))
    if seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {seeds}")
    overrides = planning.selected_overrides(set_ or [], methods, selection)
    snapshots = frozenset(parse_ints(snapshot_rounds, "snapshot rounds")) if snapshot_rounds else frozenset()
    for m in counts:
        check_clients(partition, m)
    specs = [
        make_spec(meth, ds, partition, m, seed, overrides[meth], rounds, local_epochs, data_seed, protocol, tuned_dir,
                  participation=participation)
        for ds in datasets for m in counts for meth in methods for seed in range(seeds)
    ]  # fmt: skip
    if stack_seeds < 1:
        raise UserError(f"--stack-seeds must be at least 1, got {stack_seeds}")
    planning.check_snapshot_rounds(snapshots, specs)
    env = Environment(
        device, data_dir or default_data_dir(), threads, snapshots, snapshot_dir, batched, sparse_features, stack_seeds
    )
    no_snapshots = frozenset(
        s.run_key for s in specs if any(not (snapshot_dir / s.run_key / f"round{r}.pt").exists() for r in snapshots)
    )
    _run_grid(specs, store, env, workers, force, retry_failed, rerun=no_snapshots)


@friendly
def sweep(
    table_: Annotated[
        str | None,
        typer.Option(
            "--table", help="Run what paper table 1, 2, 4, 5, 6, 7, 'sensitivity' (the figures) or 'all' of them needs."
        ),
    ] = None,
    method: Annotated[str | None, typer.Option("--method", "-m", help="Only these methods (or the grid's).")] = None,
    dataset: Annotated[str | None, typer.Option("--datasets", "--dataset", "-d", help="Only these datasets.")] = None,
    partition: Annotated[str, typer.Option("--partition", "--scheme", help="Scheme of an explicit grid.")] = "metis",
    alpha: SchemeAlphaOption = None,
    partition_file: PartitionFileOption = None,
    clients: Annotated[str | None, typer.Option(help="Client counts of an explicit grid.")] = None,
    seeds: RunSeedsOption = 10,
    dry_run: Annotated[
        bool, typer.Option(help="List the missing runs and an estimate of their time; run nothing.")
    ] = False,
    workers: WorkersOption = 1,
    executor: Annotated[str, typer.Option(help="local (worker processes) or ray (an existing Ray cluster).")] = "local",
    address: Annotated[str | None, typer.Option(help="Ray cluster address, e.g. auto.")] = None,
    gpus_per_run: Annotated[
        float | None,
        typer.Option(
            help="Fraction of a GPU each Ray task reserves (default: 1/--workers when the device is cuda, "
            "or auto on a cluster with GPUs; 0 otherwise)."
        ),
    ] = None,
    device: DeviceOption = "auto",
    threads: ThreadsOption = 1,
    batched: BatchedOption = False,
    stack_seeds: StackOption = 1,
    sparse_features: SparseOption = False,
    set_: SetOption = None,
    rounds: RoundsOption = None,
    local_epochs: EpochsOption = None,
    protocol: ProtocolOption = DEFAULT_PROTOCOL,
    tuned_dir: TunedOption = None,
    selection: SelectionOption = "global",
    data_dir: DataDirOption = None,
    store: StoreOption = DEFAULT_STORE,
    retry_failed: RetryOption = False,
    participation: ParticipationOption = 1.0,
) -> None:
    """Run every run a paper table (or an explicit grid) needs that the store lacks, and nothing else."""
    from gflbench.core.method import all_methods
    from gflbench.data.partition import default_clients, scheme_label
    from gflbench.experiments.execute import Environment
    from gflbench.experiments.spec import at_participation
    from gflbench.paper import planning
    from gflbench.paper.sweep import SWEEP_TABLES, Grid, estimate

    check_protocol(protocol)
    _check_rule(selection)
    registered = list(all_methods())
    if seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {seeds}")
    if table_ is not None and partition_file is not None:
        raise UserError("--partition-file applies to an explicit grid (--method, --datasets), not to --table")
    if table_ is not None:
        # "all": every run the paper's tables and sensitivity figures need, each once
        chosen_tables = (*SWEEP_TABLES, "sensitivity") if table_ == "all" else (table_,)
        methods = split_list(method, "methods") if method else None
        datasets = split_list(dataset, "datasets") if dataset else None
        planned = [planning.table_specs(t, registered, methods, datasets, seeds, set_ or [], selection, rounds,
                                        local_epochs, protocol, tuned_dir, part_of_all=table_ == "all")
                   for t in chosen_tables]  # fmt: skip
        skipped = sorted({m for _, lacking in planned for m in lacking})
        if skipped:
            console.print(f"not implemented yet, skipped: {', '.join(skipped)}")
        specs = list({s.run_key: s for table_specs, _ in planned for s in table_specs}.values())
    else:
        if method is None or dataset is None:
            raise UserError("give --table N, or an explicit grid with --method and --datasets")
        partition = scheme_label(partition, alpha)
        if partition_file is not None:  # the grid runs at the protocol's data seed: refused unless the manifest's
            partition, counts = _partition_file_at_default_seed(partition_file, split_list(dataset, "datasets"), clients,
                                                                data_dir)  # fmt: skip
        else:
            counts = parse_ints(clients, "client counts") if clients else list(default_clients(partition))
        grid = Grid(tuple(split_list(method, "methods")), tuple(split_list(dataset, "datasets")),
                    tuple((partition, c) for c in counts))  # fmt: skip
        specs = planning.grid_run_specs(grid, seeds, set_ or [], selection, rounds, local_epochs, protocol, tuned_dir)
    specs = [at_participation(s, participation) for s in specs]
    if stack_seeds < 1:
        raise UserError(f"--stack-seeds must be at least 1, got {stack_seeds}")
    env = Environment(device, data_dir or default_data_dir(), threads, batched=batched, sparse_features=sparse_features,
                      stack_seeds=stack_seeds)  # fmt: skip
    _check_parallel(threads, workers)  # a dry run refuses what the real one would
    if dry_run:
        import pandas as pd

        from gflbench.experiments.execute import pending

        if Path(store).exists():
            with RunStore(store) as runs:
                todo = pending(specs, runs, False, retry_failed)
                plan = estimate(todo, runs.frame(), device=planning.planned_device(env.device))
        else:  # a dry run writes nothing, not even an empty store
            todo, plan = specs, estimate(specs, pd.DataFrame(), device=planning.planned_device(env.device))
        known = plan["est. seconds"].dropna()
        plan["est. seconds"] = plan["est. seconds"].map(lambda v: "?" if v != v else f"{v:.0f}")
        sys.stdout.write(plan.to_markdown(index=False) + "\n" if len(plan) else "")
        console.print(
            f"{len(specs)} runs in the grid, {len(todo)} missing; estimated {known.sum() / 3600:.2f} h of run time "
            f"for the {int(plan.loc[plan['est. seconds'] != '?', 'runs'].sum())} with a basis "
            f"(one worker; the `basis` column says where each estimate comes from: the store's times leave "
            f"evaluation out, bench/round_times.csv includes it)"
        )
        if workers == 0 and todo:
            from gflbench.experiments.runner import resolve_device

            workers = _packed_workers(todo, str(resolve_device(env.device)))
        if workers > 1:
            console.print(f"with {workers} workers: about {known.sum() / 3600 / workers:.2f} h of wall time, "
                          f"if runs sharing the device do not slow each other down")  # fmt: skip
        return
    _run_grid(specs, store, env, workers, False, retry_failed, executor, address, gpus_per_run)


def _packed_workers(todo: list[RunSpec], device: str) -> int:
    """`--workers 0`: the packing rule's worker count for these runs on this device, said in one line."""
    from gflbench.paper.sweep import free_memory_mb, load_round_times, packed_workers, run_memory_mb, usable_cores

    run_mb, basis = run_memory_mb(todo, load_round_times(), device)
    free, cores = free_memory_mb(device), usable_cores()
    workers = packed_workers(run_mb, free, cores, len(todo), device.startswith("cuda"))
    size = f"{run_mb:.0f} MB per run ({basis})" if run_mb == run_mb else f"per-run memory unknown ({basis})"
    console.print(f"workers: {workers} (packing rule: {cores} cores, {free:.0f} MB free on {device}, {size})")
    return workers


def _run_grid(
    specs: list[RunSpec],
    store: Path,
    env: Environment,
    workers: int,
    force: bool,
    retry_failed: bool,
    executor: str = "local",
    address: str | None = None,
    gpus_per_run: float | None = None,
    rerun: frozenset[str] = frozenset(),
) -> None:
    """Validate devices and data up front, then execute the missing runs with progress, then summarise."""
    from gflbench.experiments.execute import Events, check_gpu_share, execute, pending, per_client_fallbacks
    from gflbench.experiments.runner import DataCache, check_measurable, resolve_device

    _check_parallel(env.threads, workers)
    check_gpu_share(executor, env.device, gpus_per_run)
    if executor == "local":
        device = resolve_device(env.device)
        cache = DataCache(env.data_dir, env.data_dir / "partitions" if env.data_dir else None)
        for key in sorted({(s.dataset, s.scheme, s.clients, s.data_seed) for s in specs}):
            check_measurable(cache.federated(*key))  # a missing dataset, an impossible or unmeasurable partition
    with RunStore(store, _say) as runs:
        runs.ensure_writable()  # a read-only or locked store is refused before any run, not after it is computed
        todo = pending(specs, runs, force, retry_failed, rerun)
        fallbacks = per_client_fallbacks(todo) if env.batched or env.stack_seeds > 1 else []
        if fallbacks:  # an executor a method cannot use is said, not silently ignored
            _say(
                f"{'--batched' if env.batched else '--stack-seeds'}: {', '.join(fallbacks)} cannot be batched; their "
                "runs take the per-client path (`gflbench methods` lists which methods can be)"
            )
        if workers == 0 and executor == "local":
            workers = _packed_workers(todo, str(device))
        stored = runs.statuses()
        again = sum(1 for s in todo if s.run_key in rerun and s.run_key in stored)
        console.print(
            f"{len(specs)} runs asked, {len(specs) - len(todo)} already stored, {len(todo)} to run "
            + (f"({again} of them stored, run again for their snapshots) " if again else "")
            + f"({'workers: ' + str(workers) if executor == 'local' else 'Ray'}, device {env.device})"
        )
        # a bar with ETA in a terminal; piped or redirected, one plain line per finished run
        terminal = console.is_terminal
        begun, done = time.time(), [0]
        with _progress() if terminal else contextlib.nullcontext() as progress:
            overall = progress.add_task("runs", total=len(todo), status="") if terminal else 0
            tasks: dict[str, int] = {}

            def started(spec: RunSpec) -> None:
                if terminal and workers == 1 and executor == "local":
                    tasks[spec.run_key] = progress.add_task(_label(spec), total=spec.rounds, status="")

            def round_done(spec: RunSpec, index: int, val: float, test: float) -> None:
                if spec.run_key in tasks:
                    progress.update(tasks[spec.run_key], advance=1, status=f"val {val * 100:.2f} test {test * 100:.2f}")

            def finished(spec: RunSpec, record: dict) -> None:
                done[0] += 1
                outcome = f"test {record['test'] * 100:.2f}" if record["status"] == "ok" else "FAILED"
                outcome += f" on {record.get('device', '?')}"  # the device the run resolved to (auto, Ray)
                if terminal:
                    if spec.run_key in tasks:
                        progress.remove_task(tasks.pop(spec.run_key))
                    progress.update(overall, advance=1, status=f"last: {_label(spec)} {outcome}")
                else:
                    elapsed = time.time() - begun
                    eta = elapsed / done[0] * (len(todo) - done[0])
                    seconds = record["finished_at"] - record["started_at"]
                    sys.stdout.write(f"{done[0]}/{len(todo)} {_label(spec)} {outcome} {seconds:.0f} s "
                                     f"ETA {_duration(eta)}\n")  # fmt: skip
                    sys.stdout.flush()
                if record["status"] != "ok":
                    err_console.print(f"run failed: {_label(spec)}: {record['error']}", markup=False, soft_wrap=True)

            execute(
                todo, runs, env, workers, executor, address, gpus_per_run, Events(started, round_done, finished, _say)
            )
        _print_summary(runs, specs)
        statuses = runs.statuses()
        failed = sum(1 for s in specs if statuses.get(s.run_key) == "failed")
        spool, spooled = runs.spool, runs.spooled
    if failed:
        err_console.print(
            f"{failed} runs of this grid are stored as failed; list them with their error: "
            f"gflbench failed --store {store}" + ("" if retry_failed else "; --retry-failed runs them again"),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    if spool is not None:
        _say(
            f"{spooled} finished runs could not be written to the run store {store} and are kept in {spool}: "
            f"`gflbench import {spool} --store {store}` adds them (do it before a rerun, which would compute them again)"
        )
    if failed or spool is not None:
        raise typer.Exit(1)


def _print_summary(runs: RunStore, specs: list[RunSpec]) -> None:
    """Mean±std over the seeds of this command's grid, from the store."""
    import pandas as pd

    frame = runs.frame()
    keys = {s.run_key for s in specs}
    mine = frame[frame["run_key"].isin(keys) & (frame["status"] == "ok")]
    if mine.empty:
        return
    grouped = mine.groupby(["method", "dataset", "scheme", "clients"])["test"]
    summary = pd.DataFrame({"mean": grouped.mean() * 100, "std": grouped.std(ddof=0) * 100, "n": grouped.size()})
    table = Table("method", "dataset", "partition", "clients", "test (mean±std)", "seeds", title="This grid")
    for (meth, ds, scheme, m), row in summary.iterrows():
        table.add_row(meth, ds, scheme, str(m), f"{row['mean']:.2f}±{row['std']:.2f}", str(int(row["n"])))
    console.print(table)


@friendly
def failed(store: StoreOption = DEFAULT_STORE) -> None:
    """Every run stored as failed, one line each, with its error; `--retry-failed` on run or sweep runs them again."""
    with RunStore(store) as runs:
        records = [r for r in runs.records() if r.get("status") == "failed"]
    for r in records:
        sys.stdout.write(f"{r['method']} {r['dataset']} {r['scheme']}-{r['clients']} seed {r['seed']} "
                         f"protocol {r.get('protocol') or 'paper'}: {r.get('error', '')}\n")  # fmt: skip
    console.print(f"{len(records)} failed runs in {store}", soft_wrap=True)
