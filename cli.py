"""The `gflbench` command line: run, table, datasets, partitions, methods.

Every command validates its whole input before doing any work: a bad name or count prints one
line on stderr and exits with 2, and nothing is stored. A grid stores each run the moment it
finishes, so Ctrl-C or a crash loses at most the run in progress; rerunning skips stored runs.
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import functools
import json
import os
import signal
import sys
import time
import traceback
import unicodedata
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

# What a non-UTF-8 stdout (PYTHONIOENCODING=latin-1, a C locale) gets instead of a character it cannot encode;
# box-drawing lines become - | +, anything else unlisted its unaccented letter or ?.
_ASCII = {"±": "+-", "†": "+", "↓": "v", "↑": "^", "≡": "==", "⚑": "!", "×": "x", "α": "alpha", "χ": "chi",
          "²": "2", "—": "-", "–": "-", "·": ".", "∈": " in ", "…": "..."}  # fmt: skip


def _ascii_spelling(error: UnicodeError) -> tuple[str, int]:
    """Codec error handler: ASCII spellings for what the stream's encoding lacks, so that a table or a
    list still prints whole (rich draws its own borders in ASCII there) instead of failing."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    spelled = []
    for char in error.object[error.start : error.end]:
        name = unicodedata.name(char, "")
        if char in _ASCII:
            spelled.append(_ASCII[char])
        elif name.startswith("BOX DRAWINGS"):
            spelled.append(
                "+" if ("VERTICAL" in name) == ("HORIZONTAL" in name) else "|" if "VERTICAL" in name else "-"
            )
        else:
            spelled.append(unicodedata.normalize("NFKD", char).encode("ascii", "ignore").decode() or "?")
    return "".join(spelled), error.end


codecs.register_error("gflbench-ascii", _ascii_spelling)
for _stream in (sys.stdout, sys.stderr):
    if hasattr(_stream, "reconfigure") and not codecs.lookup(_stream.encoding or "ascii").name.startswith("utf"):
        _stream.reconfigure(errors="gflbench-ascii")

if not sys.stdout.isatty():  # piped help is never cut to 80 columns (typer reads this when it formats help)
    os.environ.setdefault("TERMINAL_WIDTH", "200")

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from gfl_bench.datasets import DATA_DIR_ENV, VERBOSE_ENV, dataset_spec, default_data_dir
from gfl_bench.errors import UserError
from gfl_bench.protocol import DEFAULT_PROTOCOL, PROTOCOLS, TUNED_ENV, check_protocol
from gfl_bench.store import DEFAULT_STORE, RESULTS_ENV, RunStore

if TYPE_CHECKING:  # names for annotations only: importing them here would load torch for `--help`
    from gfl_bench.execute import Environment
    from gfl_bench.spec import RunSpec

# Off a terminal (piped, redirected, a log file) nothing is wrapped or cut: lines are as long as they need.
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 10000)
err_console = Console(stderr=True, soft_wrap=True, width=None if sys.stderr.isatty() else 10000)


try:  # typer 0.2x parses with its own copy of click, earlier versions with click itself
    from typer._click.exceptions import UsageError
except ImportError:
    from click.exceptions import UsageError


class OneLineUsageErrors(typer.core.TyperGroup):
    """The `gflbench` group: a command line click cannot parse (`--seeds ten`, an unknown option or command, a
    missing one) is one line on stderr and exit 2, like every other bad input, instead of typer's five-line box.

    Parsing happens in the group's `make_context` (its own options) and `invoke` (the command's name, then the
    command's options), so both turn click's `UsageError` into the line and `typer.Exit(2)`, which typer ends
    as it ends any exit. A bare `gflbench` or `gflbench plot` still shows its help (NoArgsIsHelpError).
    """

    def make_context(self, info_name: str | None, args: list[str], parent: typer.Context | None = None,
                     **extra: Any) -> typer.Context:  # fmt: skip
        with _usage_errors_in_one_line():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: typer.Context) -> Any:
        with _usage_errors_in_one_line():
            return super().invoke(ctx)


@contextlib.contextmanager
def _usage_errors_in_one_line() -> Iterator[None]:
    """`error: <click's message>; see `<command> --help``, exit 2, for a command line that does not parse."""
    try:
        yield
    except UsageError as error:
        if type(error).__name__ == "NoArgsIsHelpError":  # click >= 8.2's way to show the help: let typer show it
            raise
        message = " ".join(error.format_message().split()).rstrip(".")
        where = f"; see `{error.ctx.command_path} --help`" if error.ctx is not None else ""
        err_console.print(f"error: {message[:1].lower()}{message[1:]}{where}", markup=False, highlight=False,
                          soft_wrap=True)  # fmt: skip
        raise typer.Exit(2) from None


app = typer.Typer(
    cls=OneLineUsageErrors,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="gflbench: subgraph federated learning benchmark (FedGMC and baselines).",
)


@app.callback()
def main(
    verbose: Annotated[bool, typer.Option("--verbose", help="Show library output (PyG processing, warnings).")] = False,
) -> None:
    """gflbench: subgraph federated learning benchmark (FedGMC and baselines)."""
    if verbose:
        os.environ[VERBOSE_ENV] = "1"  # worker processes inherit it
    else:
        warnings.filterwarnings("ignore")
    signal.signal(signal.SIGTERM, _terminated)  # a batch system's stop closes like Ctrl-C, not mid-statement


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the driver is, so that it stops as on Ctrl-C: every finished run stored (or
    spooled), the workers ended, one line, exit 143."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated


DataDirOption = Annotated[Path | None, typer.Option("--data-dir", envvar=DATA_DIR_ENV, help="Writable dataset folder.")]
StoreOption = Annotated[Path, typer.Option("--store", envvar=RESULTS_ENV, help="Run store (SQLite file).")]
SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="Hyperparameter override method.key=value (or key=value for all); repeatable."),
]
SelectionOption = Annotated[
    str,
    typer.Option(
        "--selection",
        help="global: each run's test value at its best client-mean validation round (FED-PUB, default); "
        "per-client: each client at its own best validation round (FedICI's code), and methods that select "
        "inside themselves (AdaFGL's best epoch) run with that switch on. docs/protocol.md.",
    ),
]
MethodsOption = Annotated[str, typer.Option("--method", "-m", help="Method name(s), comma-separated.")]
DatasetsOption = Annotated[str, typer.Option("--dataset", "-d", help="Dataset name(s), comma-separated.")]
PartitionOption = Annotated[
    str,
    typer.Option("--partition", "--scheme", help="metis, overlap (the paper's), louvain or dirichlet (with --alpha)."),
]
SchemeAlphaOption = Annotated[
    float | None,
    typer.Option("--alpha", help="The dirichlet scheme's concentration (> 0; smaller: more label skew)."),
]
PartitionFileOption = Annotated[
    Path | None,
    typer.Option(
        "--partition-file", help="A split manifest (`gflbench partitions --export`): run its split, not --partition's."
    ),
]
ProtocolOption = Annotated[
    str,
    typer.Option(
        "--protocol",
        help="paper: each method as the paper's numbers were produced; fair: every method tuned on validation "
        "with the same budget (`gflbench tune` first). docs/protocol.md.",
    ),
]
TunedOption = Annotated[
    Path | None,
    typer.Option(
        "--tuned-dir", envvar=TUNED_ENV, help="Folder of the fair protocol's tuned values (default results/tuned)."
    ),
]
RoundsOption = Annotated[int | None, typer.Option("--rounds", help="Override the dataset's round count.")]
AlphaOption = Annotated[
    float, typer.Option("--alpha", help="Significance level of `table`'s marks and `plot ranks` (docs/protocol.md).")
]
TestOption = Annotated[
    str, typer.Option("--test", help="Paired test against each column's best: t (from 3 seeds) or wilcoxon (from 6).")
]
EpochsOption = Annotated[
    int | None, typer.Option("--local-epochs", help="Override the dataset's local epochs per round.")
]


def friendly(command: Callable[..., Any]) -> Callable[..., Any]:
    """Turn UserError into one line and exit 2, Ctrl-C into exit 130 (SIGTERM 143), a closed pipe into a
    quiet exit, anything else into one line and 1."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except UserError as error:
            err_console.print(f"error: {error}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt as stop:
            err_console.print("interrupted; every finished run is stored, rerun the same command to resume")
            raise typer.Exit(143 if isinstance(stop, Terminated) else 130) from None
        except (typer.Exit, BrokenPipeError):  # a reader that closed early (`| head -1`): typer exits quietly
            raise
        except Exception as error:  # a bug or a failed library call: say what, not a traceback
            if os.environ.get("GFLBENCH_DEBUG"):
                traceback.print_exc()
            err_console.print(
                f"error: {type(error).__name__}: {error} (set GFLBENCH_DEBUG=1 for the traceback)",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(1) from None

    return wrapper


def _say(line: str) -> None:
    """One plain line on stderr (a note from the store: a wait for a lock, a spooled run)."""
    err_console.print(line, markup=False, highlight=False, soft_wrap=True)


def split_list(text: str, what: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise UserError(f"no {what} given")
    return list(dict.fromkeys(items))


def parse_ints(text: str, what: str) -> list[int]:
    try:
        return [int(t) for t in split_list(text, what)]
    except ValueError:
        raise UserError(f"{what} must be comma-separated integers, got {text!r}") from None


WorkersOption = Annotated[
    int,
    typer.Option(
        help="Runs in parallel, each a whole run in its own process (several may share a GPU); 0: as many "
        "as the cores and the measured per-run memory allow (gfl_bench/sweep.py `packed_workers`)."
    ),
]
ThreadsOption = Annotated[
    int,
    typer.Option(
        help="CPU threads per run (0: torch's default). Client graphs are small: one thread avoids "
        "oversubscription when runs share a machine."
    ),
]
RetryOption = Annotated[bool, typer.Option(help="Run again the cells stored as failed.")]
BatchedOption = Annotated[
    bool,
    typer.Option(
        "--batched/--per-client",
        help="Train all clients of a batchable method in one pass per epoch (same numbers "
        "up to float rounding on CPU; gfl_bench/batched.py). `gflbench methods` says which methods are (its "
        "`batched` column, from each method's registration); the others run per client, and are named.",
    ),
]
StackOption = Annotated[
    int,
    typer.Option(
        help="Step up to N seeds of one configuration of a batchable method together in one process, every "
        "client of every seed in one batched pass (implies --batched for them); each seed's numbers are its "
        "own (gfl_bench/randomness.py). Pays on a GPU; bench/stacked_seeds.py measures it."
    ),
]
SparseOption = Annotated[
    bool,
    typer.Option(
        "--sparse-features/--dense-features",
        help="First layer from a CSR copy of the features: 2-5× "
        "cheaper on bag-of-words graphs (bench/sparse_features.py); same numbers up to float rounding.",
    ),
]


@app.command()
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
    seeds: Annotated[int, typer.Option(help="Run seeds 0..N-1.")] = 10,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
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
    data_seed: Annotated[
        int | None, typer.Option(help="Seed of the split and partition; default the protocol's fixed one.")
    ] = None,
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
    from gfl_bench import planning
    from gfl_bench.execute import Environment
    from gfl_bench.partition import DEFAULT_DATA_SEED, check_clients, default_clients, scheme_label
    from gfl_bench.spec import make_spec

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
        make_spec(meth, ds, partition, m, seed, overrides[meth], rounds, local_epochs, data_seed, protocol, tuned_dir)
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


@app.command()
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
    seeds: Annotated[int, typer.Option(help="Run seeds 0..N-1.")] = 10,
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
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
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
) -> None:
    """Run every run a paper table (or an explicit grid) needs that the store lacks, and nothing else."""
    from gfl_bench import planning
    from gfl_bench.execute import Environment
    from gfl_bench.method import all_methods
    from gfl_bench.partition import default_clients, scheme_label
    from gfl_bench.sweep import SWEEP_TABLES, Grid, estimate

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
    if stack_seeds < 1:
        raise UserError(f"--stack-seeds must be at least 1, got {stack_seeds}")
    env = Environment(device, data_dir or default_data_dir(), threads, batched=batched, sparse_features=sparse_features,
                      stack_seeds=stack_seeds)  # fmt: skip
    _check_parallel(threads, workers)  # a dry run refuses what the real one would
    if dry_run:
        import pandas as pd

        from gfl_bench.execute import pending

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
            from gfl_bench.runner import resolve_device

            workers = _packed_workers(todo, str(resolve_device(env.device)))
        if workers > 1:
            console.print(f"with {workers} workers: about {known.sum() / 3600 / workers:.2f} h of wall time, "
                          f"if runs sharing the device do not slow each other down")  # fmt: skip
        return
    _run_grid(specs, store, env, workers, False, retry_failed, executor, address, gpus_per_run)


def _partition_file(
    path: Path, datasets: list[str], clients: str | None, data_dir: Path | None
) -> tuple[str, list[int], int]:
    """Check a split manifest, copy it into the partition cache: its scheme label, [client count], data seed."""
    from gfl_bench.manifest import register

    if len(datasets) != 1:
        raise UserError(
            f"--partition-file holds one dataset's split; give that dataset alone, not {', '.join(datasets)}"
        )
    label, count, data_seed = register(path, datasets[0], (data_dir or default_data_dir()) / "partitions")
    if clients is not None and parse_ints(clients, "client counts") != [count]:
        raise UserError(f"{path} has {count} clients; drop --clients or give {count}")
    return label, [count], data_seed


def _partition_file_at_default_seed(
    path: Path, datasets: list[str], clients: str | None, data_dir: Path | None
) -> tuple[str, list[int]]:
    """`_partition_file` for sweep, tune and table, which run (or look up) the protocol's data seed only."""
    from gfl_bench.partition import DEFAULT_DATA_SEED

    label, counts, data_seed = _partition_file(path, datasets, clients, data_dir)
    if data_seed != DEFAULT_DATA_SEED:
        raise UserError(f"{path} was made at data seed {data_seed}; this command uses {DEFAULT_DATA_SEED}: "
                        "use `gflbench run --partition-file` (and its --data-seed)")  # fmt: skip
    return label, counts


def _packed_workers(todo: list[RunSpec], device: str) -> int:
    """`--workers 0`: the packing rule's worker count for these runs on this device, said in one line."""
    from gfl_bench.sweep import free_memory_mb, load_round_times, packed_workers, run_memory_mb, usable_cores

    run_mb, basis = run_memory_mb(todo, load_round_times(), device)
    free, cores = free_memory_mb(device), usable_cores()
    workers = packed_workers(run_mb, free, cores, len(todo), device.startswith("cuda"))
    size = f"{run_mb:.0f} MB per run ({basis})" if run_mb == run_mb else f"per-run memory unknown ({basis})"
    console.print(f"workers: {workers} (packing rule: {cores} cores, {free:.0f} MB free on {device}, {size})")
    return workers


def _check_rule(selection: str) -> None:
    from gfl_bench import tables

    tables.check_rule(selection)


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
    from gfl_bench.execute import Events, check_gpu_share, execute, pending, per_client_fallbacks
    from gfl_bench.runner import DataCache, check_measurable, resolve_device

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


def _check_parallel(threads: int, workers: int) -> None:
    if threads < 0 or workers < 0:
        raise UserError("--threads must be 0 or more and --workers 0 (automatic) or more")


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def _label(spec: RunSpec) -> str:
    return f"{spec.method} {spec.dataset} {spec.scheme}-{spec.clients} seed {spec.seed}"


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[status]}"),
        console=console,
        transient=False,
    )


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


@app.command()
@friendly
def failed(store: StoreOption = DEFAULT_STORE) -> None:
    """Every run stored as failed, one line each, with its error; `--retry-failed` on run or sweep runs them again."""
    with RunStore(store) as runs:
        records = [r for r in runs.records() if r.get("status") == "failed"]
    for r in records:
        sys.stdout.write(f"{r['method']} {r['dataset']} {r['scheme']}-{r['clients']} seed {r['seed']} "
                         f"protocol {r.get('protocol') or 'paper'}: {r.get('error', '')}\n")  # fmt: skip
    console.print(f"{len(records)} failed runs in {store}", soft_wrap=True)


@app.command()
@friendly
def export(
    out: Annotated[Path, typer.Argument(help="File to write: JSON Lines, gzip-compressed if it ends in .gz.")],
    method: Annotated[str | None, typer.Option("--method", "-m", help="Only these methods (comma-separated).")] = None,
    dataset: Annotated[
        str | None, typer.Option("--dataset", "-d", help="Only these datasets (comma-separated).")
    ] = None,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Write stored runs (whole records: curves, config, provenance) to one file, to move them to another
    machine or commit the runs behind a table; `gflbench import` reads it back."""
    from gfl_bench.store import write_records

    if not store.exists():
        raise UserError(f"no run store at {store}")
    methods_wanted = set(split_list(method, "methods")) if method else None
    datasets_wanted = set(split_list(dataset, "datasets")) if dataset else None
    with RunStore(store) as runs:
        records = [r for r in runs.records()
                   if (methods_wanted is None or r["method"] in methods_wanted)
                   and (datasets_wanted is None or r["dataset"] in datasets_wanted)]  # fmt: skip
    if not records:
        raise UserError(f"no stored runs in {store} match; nothing written")
    console.print(f"exported {write_records(out, records)} runs from {store} to {out}", soft_wrap=True)


@app.command("import")
@friendly
def import_runs(
    files: Annotated[list[Path], typer.Argument(help="Files written by `gflbench export`.")],
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Add the runs of exported files to the store: every record of every file is read and checked first
    (finite numbers, required fields, keys that follow from its config and seed, values that are its
    curves'), and records that disagree on a run are refused; then all new runs are stored in one
    transaction. A run already stored under the same execution (run key and execution key) is kept as it
    is, and said when it differs; another execution of a stored run is added beside it."""
    from gfl_bench.store import differing_from_stored, disagreements, distinct, read_records

    imported = [item for path in files for item in read_records(path)]
    clashes = disagreements(imported)
    if clashes:
        raise UserError(f"{len(clashes)} runs have records that disagree: {_some(clashes)}; nothing was imported")
    records = distinct(imported)
    with RunStore(store, _say) as runs:
        differ = differing_from_stored(runs, records)
        added = runs.put_many(records)
    console.print(f"imported {added} new runs into {store}; {len(records) - added} were already stored", soft_wrap=True)
    if differ:
        _say(
            f"{len(differ)} imported runs differ from the run stored under the same key, which was kept: {_some(differ)}"
        )


def _some(items: list[str], shown: int = 5) -> str:
    """The first few items of a list for a one-line message, and how many more there are."""
    more = len(items) - shown
    return "; ".join(items[:shown]) + (f"; and {more} more" if more > 0 else "")


@app.command()
@friendly
def table(
    number: Annotated[
        str | None, typer.Argument(help="Paper table 1-7 or 'all'; default every results table that has runs.")
    ] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="terminal, markdown, latex or csv.")] = "terminal",
    out: Annotated[Path | None, typer.Option(help="Write to this file instead of the terminal.")] = None,
    method: Annotated[str | None, typer.Option("--method", "-m", help="Rows; default every stored method.")] = None,
    dataset: Annotated[
        str | None,
        typer.Option("--dataset", "-d", help="With a table number: only these datasets; without: a custom table."),
    ] = None,
    partition: Annotated[
        str,
        typer.Option("--partition", "--scheme", help="Scheme of a custom table (a Dirichlet one as dirichlet-0.5)."),
    ] = "metis",
    partition_file: PartitionFileOption = None,
    seeds: Annotated[int, typer.Option(help="Seeds a full cell has; cells with another count are marked (n=k).")] = 10,
    selection: SelectionOption = "global",
    value: Annotated[
        str, typer.Option(help="test, or val: the validation values settings are chosen by (never a result).")
    ] = "test",
    alpha: AlphaOption = 0.05,
    test: TestOption = "t",
    set_: SetOption = None,
    rounds: RoundsOption = None,
    local_epochs: EpochsOption = None,
    protocol: ProtocolOption = DEFAULT_PROTOCOL,
    tuned_dir: TunedOption = None,
    store: StoreOption = DEFAULT_STORE,
    data_dir: DataDirOption = None,
) -> None:
    """Render the paper's Tables 1-7 (mean±std, its layout) from the run store; Table 3 from the data.

    In Tables 1, 2, 4, 5 and custom tables, each dataset column marks its best mean and the methods not
    significantly worse than it (docs/protocol.md, "Statistics")."""
    from gfl_bench import planning, tables
    from gfl_bench.method import all_methods
    from gfl_bench.partition import scheme_label
    from gfl_bench.significance import PairedTest
    from gfl_bench.spec import parse_overrides

    check_protocol(protocol)
    paired = PairedTest(test, alpha)
    tables.check_format(fmt)
    tables.check_rule(selection)
    tables.check_value(value)
    numbers = _table_numbers(number)
    chosen_datasets = split_list(dataset, "datasets") if dataset else None
    for d in chosen_datasets or []:
        dataset_spec(d)
    file_clients = None  # a manifest's client count: the custom table's only column per dataset
    if number is None and chosen_datasets:
        partition = scheme_label(partition)
        if partition_file is not None:
            partition, file_clients = _partition_file_at_default_seed(partition_file, chosen_datasets, None, data_dir)
    elif partition_file is not None:
        raise UserError("--partition-file applies to a custom table (--dataset without a table number)")
    registered = all_methods()
    frame = _stored_runs(store) if numbers != [3] else None
    methods = _chosen_methods(method, frame, registered) if frame is not None else []
    rows = [m for m in methods if m not in tables.ABLATIONS]
    overrides = parse_overrides(set_ or [], list(registered))
    titles = {m: cls.title for m, cls in registered.items()}
    if frame is not None:
        executions = _stored_runs(store, every_execution=True)  # for the cells' execution bands
        sel = tables.Selection(frame, overrides, rounds, local_epochs, seeds, selection, protocol, tuned_dir, value,
                               executions)  # fmt: skip
    rendered = []
    for n in numbers if not (number is None and chosen_datasets) else [0]:
        if n == 0:
            blocks, caption = (
                tables.results_table(0, sel, rows, titles, chosen_datasets, partition, paired, file_clients),
                f"{', '.join(chosen_datasets)}, {partition} partitioning",
            )
        elif n == 3:
            blocks, caption = tables.dataset_table(data_dir or default_data_dir()), tables.CAPTIONS[3]
        elif n == 6:
            ablation_datasets = chosen_datasets or [
                d for d in tables.HOMOPHILIC + tables.HETEROPHILIC if d in set(frame["dataset"])
            ]
            blocks, caption = tables.ablation_table(sel, titles, ablation_datasets), tables.CAPTIONS[6]
        elif n == 7:
            blocks, caption = (
                tables.time_table(sel, rows, titles, chosen_datasets or tables.TIME_DATASETS),
                tables.CAPTIONS[7],
            )
        else:
            blocks, caption = (
                tables.results_table(n, sel, rows, titles, chosen_datasets, test=paired),
                tables.CAPTIONS[n],
            )
        if n != 3 and not any((b.values.notna().any().any() or (b.text == "failed").any().any()) for b in blocks):
            continue
        if selection != "global" and n not in (3, 7):
            caption = caption.rstrip(".") + (
                f". Selection: {selection} best validation round; methods that select "
                "inside themselves run with their own per-client selection on."
            )
        if value == "val" and n not in (3, 7):
            caption = caption.rstrip(".") + ". Values: VALIDATION (for choosing settings; not a result)."
        if n != 3:
            caption = sel.caption(caption)
        rendered.append(tables.render(blocks, caption, fmt))
    if not rendered:
        if frame is None or not len(frame):
            raise UserError("no stored runs match the tables' cells")
        stored = sorted(p for p in frame["protocol"].dropna().unique())
        candidates = frame[frame["method"].isin(rows)] if rows else frame
        with RunStore(store) as runs:  # one record per stored configuration
            records = runs.records(list(candidates.drop_duplicates("config_key")["run_key"]))
        nearest = planning.nearest_configurations(records, sel.spec_of, store, number)
        raise UserError(
            f"no stored runs match the tables' cells under protocol {protocol} (the store has runs of protocol "
            f"{', '.join(stored) or 'none'}); nearest stored configurations: {nearest}"
        )
    if fmt == "terminal":
        if out is not None:
            out.write_text("\n".join(_plain(r) for r in rendered))
        else:
            for r in rendered:
                _show(r)
    elif out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(rendered))
    else:
        sys.stdout.write("\n".join(rendered))
    if out is not None:
        console.print(f"wrote {out}")


def _table_numbers(number: str | None) -> list[int]:
    from gfl_bench import tables

    if number is None:
        return [1, 2, 4, 5, 6, 7]
    if number == "all":
        return list(tables.ALL_TABLES)
    if not number.isdigit() or int(number) not in tables.ALL_TABLES:
        raise UserError(f"no table {number!r}; choose from 1-7 or all")
    return [int(number)]


def _chosen_methods(method: str | None, frame, registered: dict) -> list[str]:
    """The methods named on the command line (checked), else every registered method with stored runs, in paper order."""
    from gfl_bench.tables import method_order

    names = split_list(method, "methods") if method else [m for m in frame["method"].unique() if m in registered]
    for m in names:
        if m not in registered:
            raise UserError(f"unknown method {m!r}; choose from {', '.join(sorted(registered))}")
    return method_order(names)


def _stored_runs(store: Path, every_execution: bool = False):
    """The store's runs (`RunStore.frame`): the execution tables read of each, or every execution."""
    if not Path(store).exists():
        raise UserError(f"no run store at {store}; run `gflbench run` first or pass --store")
    with RunStore(store) as runs:
        return runs.frame(every_execution)


def _show(renderable) -> None:
    """Print a rich table; off a terminal, at full width instead of squeezed into 80 columns. In a terminal
    a plain rich Table (`methods`) wraps, and folds a word wider than its column, instead of cutting it to
    `…` (rich's default); result tables fold their columns themselves (tables.FoldedTables)."""
    if console.is_terminal:
        for column in renderable.columns if isinstance(renderable, Table) else ():
            column.overflow = "fold"
        console.print(renderable)
    else:
        sys.stdout.write(_plain(renderable))


def _plain(renderable) -> str:
    capture = Console(width=10000, record=True, file=open(os.devnull, "w"))  # wide enough that nothing wraps
    capture.print(renderable)
    return "\n".join(line.rstrip() for line in capture.export_text().splitlines()) + "\n"


@app.command()
@friendly
def datasets(data_dir: DataDirOption = None) -> None:
    """The paper's Table 3 computed from the loaded data; datasets not present locally are marked absent."""
    from gfl_bench import tables

    _show(tables.render(tables.dataset_table(data_dir or default_data_dir()), tables.CAPTIONS[3], "terminal"))


@app.command()
@friendly
def compare(
    tables_: Annotated[str, typer.Option("--tables", help="Paper tables to compare, comma-separated.")] = "1,2,4,5,6,7",
    method: Annotated[str | None, typer.Option("--method", "-m", help="Methods; default every stored one.")] = None,
    out: Annotated[Path | None, typer.Option(help="Write the Markdown report to this file.")] = None,
    selection: SelectionOption = "global",
    set_: SetOption = None,
    rounds: RoundsOption = None,
    local_epochs: EpochsOption = None,
    protocol: ProtocolOption = DEFAULT_PROTOCOL,
    tuned_dir: TunedOption = None,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Ours next to the paper's published numbers for every cell we have, with flags and a summary (Markdown)."""
    from gfl_bench import tables
    from gfl_bench.compare import COMPARABLE_TABLES, to_markdown
    from gfl_bench.compare import compare as compare_cells
    from gfl_bench.method import all_methods
    from gfl_bench.spec import parse_overrides

    check_protocol(protocol)
    tables.check_rule(selection)
    chosen = parse_ints(tables_, "tables")
    for n in chosen:
        if n not in COMPARABLE_TABLES:
            raise UserError(f"table {n} has no published numbers to compare; choose from 1, 2, 4, 5, 6, 7")
    registered = all_methods()
    frame = _stored_runs(store)
    methods = _chosen_methods(method, frame, registered)
    sel = tables.Selection(frame, parse_overrides(set_ or [], list(registered)), rounds, local_epochs, rule=selection,
                           protocol=protocol, tuned=tuned_dir)  # fmt: skip
    report = to_markdown(compare_cells(sel, methods, chosen), {m: cls.title for m, cls in registered.items()}, sel)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report)
        console.print(f"wrote {out}")
    else:
        sys.stdout.write(report)


@app.command()
@friendly
def report(
    out: Annotated[Path, typer.Option("--out", help="Folder of the site (index.html and assets/).")],
    files: Annotated[
        list[Path] | None, typer.Argument(help="Exported records (`gflbench export`), with --records.")
    ] = None,
    records: Annotated[
        bool, typer.Option("--records", help="Read the FILES given (exported records) instead of the store.")
    ] = False,
    force: Annotated[bool, typer.Option(help="Write into a folder that exists and is not a previous report.")] = False,
    protocol: Annotated[
        str | None,
        typer.Option("--protocol", help="Only this protocol's leaderboard; default one leaderboard per protocol."),
    ] = None,
    seeds: Annotated[int, typer.Option(help="Seeds a full cell has; cells with another count are marked (n=k).")] = 10,
    selection: SelectionOption = "global",
    alpha: AlphaOption = 0.05,
    test: TestOption = "t",
    set_: SetOption = None,
    rounds: RoundsOption = None,
    local_epochs: EpochsOption = None,
    tuned_dir: TunedOption = None,
    store: StoreOption = DEFAULT_STORE,
    snapshots: Annotated[
        Path | None,
        typer.Option(
            "--snapshots",
            help="Folder of `gflbench run --snapshot-rounds` snapshots: FedGMC cells draw the "
            "case-study figure from it (default: none read; each such cell says what is missing).",
        ),
    ] = None,
) -> None:
    """The whole leaderboard as one static site: Tables 1, 2, 4, 5 with marks, CD diagrams, the paper's values,
    every cell's provenance, cost and per-client views (docs/report.md). SOURCE_DATE_EPOCH pins its stamp."""
    import dataclasses
    import tempfile

    from gfl_bench import report as site
    from gfl_bench.method import all_methods
    from gfl_bench.significance import PairedTest
    from gfl_bench.spec import parse_overrides
    from gfl_bench.tables import check_rule

    if bool(files) != records:
        raise UserError("--records reads the exported record files that follow it (gflbench report --records FILE... "
                        "--out DIR); give both, or neither to read --store")  # fmt: skip
    check_rule(selection)
    chosen = site.check_protocols(protocol)
    site.stamp()  # a malformed SOURCE_DATE_EPOCH is refused before any work
    registered = all_methods()
    options = site.Options(parse_overrides(set_ or [], list(registered)), rounds, local_epochs, seeds, selection,
                           PairedTest(test, alpha), tuned_dir, chosen, tuple(sorted(map(str, files or [store]))), bool(files))  # fmt: skip
    if snapshots is not None:
        if not snapshots.is_dir():
            raise UserError(f"--snapshots {snapshots}: no such folder (gflbench run --snapshot-rounds writes one)")
        options = dataclasses.replace(options, snapshots=snapshots)
    site.check_out(out, force)
    with tempfile.TemporaryDirectory(prefix="gflbench-report-") as scratch:
        if files:
            runs = site.open_records(files, Path(scratch))
        elif not store.exists():
            raise UserError(f"no run store at {store}; pass --store or --records")
        else:
            runs = RunStore(store, _say)
        with runs:
            written = site.build(runs, out, options, force)
    console.print(f"wrote {len(written)} files to {out}; open {out / 'index.html'}", soft_wrap=True)


@app.command()
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
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
    threads: ThreadsOption = 1,
    tuned_dir: TunedOption = None,
    data_dir: DataDirOption = None,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Choose each method's hyperparameters on validation (Optuna), for `--protocol fair`; resumable after a kill."""
    import torch

    from gfl_bench.partition import DEFAULT_DATA_SEED, check_clients, scheme_label
    from gfl_bench.protocol import tuned_dir as resolve_tuned
    from gfl_bench.runner import DataCache, check_measurable, resolve_device
    from gfl_bench.spec import make_spec
    from gfl_bench.tune import Budget, TuneInterrupted

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
    from gfl_bench.partition import DEFAULT_DATA_SEED
    from gfl_bench.protocol import tuned_file
    from gfl_bench.tune import TrialReport
    from gfl_bench.tune import tune as tune_method

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


plot_app = typer.Typer(no_args_is_help=True, help="The paper's figures from stored runs (PNG and PDF).")
app.add_typer(plot_app, name="plot")
FIGURES = Path("results") / "figures"


@plot_app.command("convergence")
@friendly
def plot_convergence(
    dataset: Annotated[str, typer.Option("--dataset", "-d")],
    partition: Annotated[str, typer.Option("--partition", "--scheme")] = "metis",
    clients: Annotated[int, typer.Option()] = 10,
    method: Annotated[
        str | None, typer.Option("--method", "-m", help="Methods; default every stored one except the ablations.")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="File stem; .png and .pdf are written.")] = None,
    set_: SetOption = None,
    rounds: RoundsOption = None,
    local_epochs: EpochsOption = None,
    protocol: ProtocolOption = DEFAULT_PROTOCOL,
    tuned_dir: TunedOption = None,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Test metric per round, methods overlaid (paper Fig. 3, 6, 7; FedGMC's ablations only when named)."""
    from gfl_bench import plots, tables
    from gfl_bench.method import all_methods
    from gfl_bench.partition import check_clients
    from gfl_bench.spec import parse_overrides

    check_protocol(protocol)
    dataset_spec(dataset)
    check_clients(partition, clients)
    registered = all_methods()
    frame = _stored_runs(store)
    methods = _chosen_methods(method, frame, registered)
    if method is None:
        methods = [m for m in methods if m not in tables.ABLATIONS]
    sel = tables.Selection(frame, parse_overrides(set_ or [], list(registered)), rounds, local_epochs,
                           protocol=protocol, tuned=tuned_dir)  # fmt: skip
    target = out or FIGURES / f"convergence-{dataset}-{partition}-{clients}"
    with RunStore(store) as runs:
        written = plots.convergence(
            runs, sel, methods, {m: c.title for m, c in registered.items()}, dataset, partition, clients, target
        )
    _report_figure(written)


@plot_app.command("sensitivity")
@friendly
def plot_sensitivity(
    dataset: Annotated[str, typer.Option("--dataset", "-d")],
    partition: Annotated[str, typer.Option("--partition", "--scheme")] = "metis",
    clients: Annotated[int, typer.Option()] = 10,
    out: Annotated[Path | None, typer.Option(help="File stem; .png and .pdf are written.")] = None,
    rounds: RoundsOption = None,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """FedGMC's metric with std bars over Q, B, tau, eta (paper Fig. 4, 8, 9); runs from `sweep --table sensitivity`."""
    from gfl_bench import plots, tables
    from gfl_bench.partition import check_clients

    dataset_spec(dataset)
    check_clients(partition, clients)
    sel = tables.Selection(_stored_runs(store), {}, rounds)
    _report_figure(
        plots.sensitivity(
            sel, dataset, partition, clients, out or FIGURES / f"sensitivity-{dataset}-{partition}-{clients}"
        )
    )


@plot_app.command("case-study")
@friendly
def plot_case_study(
    dataset: Annotated[str, typer.Option("--dataset", "-d")],
    partition: Annotated[str, typer.Option("--partition", "--scheme")] = "metis",
    clients: Annotated[int, typer.Option()] = 10,
    seed: Annotated[int, typer.Option(help="Run seed of the FedGMC run.")] = 0,
    rounds_: Annotated[str, typer.Option("--at", help="Two snapshot rounds: before,after.")] = "0,99",
    set_: SetOption = None,
    rounds: RoundsOption = None,
    snapshot_dir: Annotated[Path, typer.Option(help="Where `run --snapshot-rounds` saved them.")] = Path("results")
    / "snapshots",
    out: Annotated[Path | None, typer.Option(help="File stem; .png and .pdf are written.")] = None,
) -> None:
    """t-SNE of FedGMC's anchors, class means, templates and local structural manifolds at two rounds (Fig. 5)."""
    import torch

    from gfl_bench import plots
    from gfl_bench.spec import make_spec, parse_overrides

    before, after = parse_ints(rounds_, "rounds")[:2] if "," in rounds_ else (None, None)
    if before is None:
        raise UserError("--at takes two rounds, e.g. 0,99")
    overrides = parse_overrides(set_ or [], ["fedgmc"])["fedgmc"]
    spec = make_spec("fedgmc", dataset, partition, clients, seed, overrides, rounds)
    folder = snapshot_dir / spec.run_key
    paths = [folder / f"round{r}.pt" for r in (before, after)]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise UserError(
            f"no snapshot {', '.join(missing)}; make it with `gflbench run -m fedgmc -d {dataset} --partition {partition} "
            f"--clients {clients} --seeds {seed + 1} --snapshot-rounds {before},{after}`"
        )
    snaps = [torch.load(p) for p in paths]
    title = f"FedGMC on {dataset_spec(dataset).title}, {clients} clients: rounds {before} and {after}"
    _report_figure(plots.case_study(*snaps, title, out or FIGURES / f"case-study-{dataset}-{partition}-{clients}"))


@plot_app.command("ranks")
@friendly
def plot_ranks(
    number: Annotated[
        str | None,
        typer.Argument(help="Paper table 1, 2, 4 or 5; without it, the cells of --dataset and --partition."),
    ] = None,
    method: Annotated[
        str | None,
        typer.Option(
            "--method", "-m", help="Methods; default every stored one except the ablations (see docs/protocol.md)."
        ),
    ] = None,
    dataset: Annotated[str | None, typer.Option("--dataset", "-d", help="Only these datasets' cells.")] = None,
    partition: PartitionOption = "metis",
    alpha: AlphaOption = 0.05,
    selection: SelectionOption = "global",
    out: Annotated[Path | None, typer.Option(help="File stem; .png and .pdf are written.")] = None,
    set_: SetOption = None,
    rounds: RoundsOption = None,
    local_epochs: EpochsOption = None,
    protocol: ProtocolOption = DEFAULT_PROTOCOL,
    tuned_dir: TunedOption = None,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Average ranks over a table's cells: Friedman's test and a Nemenyi critical-difference diagram."""
    from gfl_bench import plots, significance, tables
    from gfl_bench.method import all_methods
    from gfl_bench.partition import default_clients, scheme_label
    from gfl_bench.spec import parse_overrides

    check_protocol(protocol)
    tables.check_rule(selection)
    significance.check_alpha(alpha)
    if number is not None and (not number.isdigit() or int(number) not in tables.RESULT_TABLES):
        raise UserError(f"no results table {number!r}; choose from {', '.join(map(str, tables.RESULT_TABLES))}")
    chosen = split_list(dataset, "datasets") if dataset else None
    if number is None and not chosen:
        raise UserError("give a table number (1, 2, 4, 5) or --dataset for the cells to rank over")
    for d in chosen or []:
        dataset_spec(d)
    partition = scheme_label(partition)
    registered = all_methods()
    frame = _stored_runs(store)
    methods = _chosen_methods(method, frame, registered)
    if method is None:
        methods = [m for m in methods if m not in tables.ABLATIONS]
    sel = tables.Selection(frame, parse_overrides(set_ or [], list(registered)), rounds, local_epochs, rule=selection,
                           protocol=protocol, tuned=tuned_dir)  # fmt: skip
    datasets, scheme = tables.result_cells(int(number or 0), chosen, partition)
    cells = [(d, scheme, c) for d in datasets for c in default_clients(scheme)]
    means, dropped_methods, dropped_cells = significance.cell_means(sel, methods, cells, named=method is not None)
    left_out = "; ".join(dropped_methods + dropped_cells) or "none"
    try:
        analysis = significance.rank_analysis(means, alpha)
    except UserError as error:
        raise UserError(f"{error} (at least {significance.RANK_MIN_SEEDS} seeds each; left out: {left_out})") from None
    caption = significance.rank_caption(analysis, protocol, selection, left_out)
    tag = number + (f"-{'-'.join(chosen)}" if chosen else "") if number else f"{'-'.join(datasets)}-{scheme}"
    titles = {m: c.title for m, c in registered.items()}
    written = plots.ranks(analysis, titles, caption, out or FIGURES / f"ranks-{protocol}-{tag}")
    console.print(caption, soft_wrap=True, markup=False, highlight=False)
    _report_figure(written)


def _report_figure(paths: list[Path]) -> None:
    if not paths:
        raise UserError("no stored runs for this figure; run or sweep them first (same --set/--rounds)")
    console.print("wrote " + ", ".join(str(p) for p in paths))


@app.command()
@friendly
def partitions(
    dataset: Annotated[str, typer.Option("--dataset", "-d")],
    scheme: Annotated[
        str, typer.Option("--scheme", "--partition", help="metis, overlap, louvain or dirichlet (with --alpha).")
    ] = "metis",
    alpha: SchemeAlphaOption = None,
    clients: Annotated[int, typer.Option(help="Number of clients.")] = 10,
    export: Annotated[
        Path | None,
        typer.Option(help="Write the partition's split manifest (gzip JSON with its sha256) to this file."),
    ] = None,
    fmt: Annotated[
        str,
        typer.Option(
            "--format", "-f", help="terminal, or csv: the heterogeneity statistics per client and summarised."
        ),
    ] = "terminal",
    data_seed: Annotated[
        int | None, typer.Option(help="Seed of the split and partition; default the protocol's fixed one.")
    ] = None,
    data_dir: DataDirOption = None,
) -> None:
    """Per-client nodes, edges, split counts, labels and heterogeneity of one partition (docs/protocol.md)."""
    import pandas as pd
    import torch

    from gfl_bench import heterogeneity
    from gfl_bench.partition import DEFAULT_DATA_SEED, check_clients, scheme_label
    from gfl_bench.runner import DataCache

    data_seed = DEFAULT_DATA_SEED if data_seed is None else data_seed  # its value lives with the partitions
    if fmt not in ("terminal", "csv"):
        raise UserError(f"unknown format {fmt!r}; choose terminal or csv")
    dataset_spec(dataset)
    scheme = scheme_label(scheme, alpha)
    check_clients(scheme, clients)
    root = data_dir or default_data_dir()
    cache = DataCache(root, root / "partitions")
    data = cache.federated(dataset, scheme, clients, data_seed)
    if export is not None:
        from gfl_bench.manifest import manifest_of, write_manifest

        manifest = manifest_of(data.partition, dataset, cache.graph(dataset))
        write_manifest(manifest, export)
        console.print(f"wrote {export} ({export.stat().st_size:,} bytes, sha256 {manifest['sha256']})", soft_wrap=True)
    graph = cache.graph(dataset)
    stats = heterogeneity.client_statistics(graph, data.graphs)
    summary = heterogeneity.summary(stats)
    imbalance = heterogeneity.quantity_imbalance(stats)
    if fmt == "csv":
        rows = stats.assign(scope="client", client=range(len(stats)))
        rows = pd.concat([rows, summary.assign(scope=summary.index, client="")], ignore_index=True)
        rows["quantity_imbalance"] = [""] * len(stats) + [f"{imbalance:.6g}"] * len(summary)
        sys.stdout.write(rows[["scope", "client", *heterogeneity.COLUMNS, "quantity_imbalance"]].to_csv(index=False))
        return
    t = Table("client", "nodes", "edges", "train", "val", "test", "labels (count per class)", "JS div.", "homophily",
              "gap", "missing", title=f"{dataset} {scheme} {clients} clients, data seed {data_seed}, hash "
              f"{data.partition.digest()}")  # fmt: skip
    for cid, g in enumerate(data.graphs):
        counts = torch.bincount(g.y, minlength=data.num_classes).tolist()
        row = stats.iloc[cid]
        t.add_row(
            str(cid), str(g.num_nodes), str(g.num_edges // 2), str(int(g.train_mask.sum())),
            str(int(g.val_mask.sum())), str(int(g.test_mask.sum())), " ".join(map(str, counts)),
            f"{row['js']:.3f}", _or_dash(row["homophily"], ".3f"), _or_dash(row["homophily_gap"], "+.3f"), f"{row['missing']:.3f}",
        )  # fmt: skip
    console.print(t)
    for name, values in summary.iterrows():
        console.print(f"{name}: nodes {values['nodes']:.1f}, edges {values['edges']:.1f}, training labels "
                      f"{values['train_labels']:.1f}, JS divergence {values['js']:.3f}, homophily {values['homophily']:.3f} "
                      f"(gap {values['homophily_gap']:+.3f}), missing neighbours {values['missing']:.3f}", soft_wrap=True)  # fmt: skip
    console.print(f"quantity imbalance (CV of client sizes) {imbalance:.3f}; global edge homophily "
                  f"{heterogeneity.edge_homophily(graph.edge_index, graph.y):.3f}", soft_wrap=True)  # fmt: skip


def _or_dash(value: float, spec: str) -> str:
    """A statistic that has no value for this client (homophily of a client without edges: NaN) shows as "-"."""
    return "-" if value != value else format(value, spec)


@app.command()
@friendly
def methods(
    protocol: ProtocolOption = DEFAULT_PROTOCOL,
    dataset: Annotated[str, typer.Option("--dataset", "-d", help="Setting the values are resolved for.")] = "cora",
    partition: Annotated[str, typer.Option("--partition", "--scheme")] = "metis",
    clients: Annotated[int, typer.Option(help="Client count of that setting.")] = 10,
    tuned_dir: TunedOption = None,
) -> None:
    """The registered methods with the backbone and hyperparameters a protocol resolves, and what `tune` searches.

    Switches are listed apart from the hyperparameters (gfl_bench/switches.py): fidelity switches choose a
    reading of the method's source (paper or released code, an interpretation), execution switches the
    arithmetic of the same math; `--set method.name=value` sets either."""
    from gfl_bench import tables
    from gfl_bench.execute import per_client_fallbacks
    from gfl_bench.method import all_methods
    from gfl_bench.partition import check_clients
    from gfl_bench.protocol import MissingTuning
    from gfl_bench.spec import make_spec
    from gfl_bench.switches import EXECUTION, FIDELITY, switches

    check_protocol(protocol)
    dataset_spec(dataset)
    check_clients(partition, clients)
    registered = all_methods()
    t = Table("name", "paper row", "backbone", "batched", "shares", "resolved values", "switches", "tune searches",
              title=f"Methods under protocol {protocol} ({PROTOCOLS[protocol]}), resolved for {dataset} {partition}-{clients}")  # fmt: skip
    for name in tables.method_order(list(registered)):
        cls = registered[name]
        try:
            spec = make_spec(name, dataset, partition, clients, 0, None, protocol=protocol, tuned=tuned_dir)
        except MissingTuning:
            t.add_row(name, cls.title, "", "yes" if cls.batchable else "no", cls.summary,
                      "not tuned yet: gflbench tune -m " + name, "", "")  # fmt: skip
            continue
        values = dataclasses.asdict(spec.params)
        backbone = values.pop("backbone")
        kinds = {kind: [n for n in switches(cls.Params, kind) if n != "backbone"] for kind in (FIDELITY, EXECUTION)}
        shown = " ".join(f"{k}={v}" for k, v in values.items() if not any(k in names for names in kinds.values()))
        toggles = "; ".join(f"{kind}: " + " ".join(f"{k}={values[k]}" for k in names)
                            for kind, names in kinds.items() if names)  # fmt: skip
        space = " ".join(f"{k}∈{s.describe()}" for k, s in cls.Params.search_space.items())
        batched = "no" if per_client_fallbacks([spec]) else "yes"  # `--batched` / `--stack-seeds` batch it
        t.add_row(name, cls.title, backbone, batched, cls.summary, shown, toggles, space)
    _show(t)


if __name__ == "__main__":
    app()
