"""What every gflbench command shares: the consoles (and a stream encoding that cannot fail), the one-line
error handling, the option types, the parsers of comma-separated lists, and the readers of the store
that several commands use. app.py wires the commands of the modules beside this one into `gflbench`.
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from gflbench.data import DATA_DIR_ENV, default_data_dir
from gflbench.errors import UserError
from gflbench.experiments.protocol import TUNED_ENV
from gflbench.experiments.store import RESULTS_ENV, RunStore

if TYPE_CHECKING:  # names for annotations only: importing them here would load torch for `--help`
    from gflbench.experiments.spec import RunSpec

# Off a terminal (piped, redirected, a log file) nothing is wrapped or cut: lines are as long as they need.
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 10000)
err_console = Console(stderr=True, soft_wrap=True, width=None if sys.stderr.isatty() else 10000)


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
ParticipationOption = Annotated[
    float,
    typer.Option(
        help="Fraction F of clients sampled per round, 0 < F <= 1 (ceil(F*M) clients; 1: every client). "
        "docs/protocol.md, 'Partial participation'."
    ),
]
PartitionFileOption = Annotated[
    Path | None,
    typer.Option(
        "--partition-file", help="A split manifest (`gflbench partitions --export`): run its split, not --partition's."
    ),
]
DatasetOption = Annotated[str, typer.Option("--dataset", "-d", help="Dataset name.")]
DeviceOption = Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")]
RunSeedsOption = Annotated[int, typer.Option(help="Run seeds 0..N-1.")]
FullSeedsOption = Annotated[int, typer.Option(help="Seeds a full cell has; cells with another count are marked (n=k).")]
DataSeedOption = Annotated[
    int | None, typer.Option(help="Seed of the split and partition; default the protocol's fixed one.")
]
FigureOption = Annotated[Path | None, typer.Option(help="File stem; .png and .pdf are written.")]
FilterMethodsOption = Annotated[
    str | None, typer.Option("--method", "-m", help="Only these methods (comma-separated; default every stored one).")
]
FilterDatasetsOption = Annotated[
    str | None, typer.Option("--dataset", "-d", help="Only these datasets (comma-separated).")
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


WorkersOption = Annotated[
    int,
    typer.Option(
        help="Runs in parallel, each a whole run in its own process (several may share a GPU); 0: as many "
        "as the cores and the measured per-run memory allow (gfl_bench/paper/sweep.py `packed_workers`)."
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
        "up to float rounding on CPU; gfl_bench/core/batched.py). `gflbench methods` says which methods are (its "
        "`batched` column, from each method's registration); the others run per client, and are named.",
    ),
]
StackOption = Annotated[
    int,
    typer.Option(
        help="Step up to N seeds of one configuration of a batchable method together in one process, every "
        "client of every seed in one batched pass (implies --batched for them); each seed's numbers are its "
        "own (gfl_bench/core/randomness.py). Pays on a GPU; bench/stacked_seeds.py measures it."
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


def _partition_file(
    path: Path, datasets: list[str], clients: str | None, data_dir: Path | None
) -> tuple[str, list[int], int]:
    """Check a split manifest, copy it into the partition cache: its scheme label, [client count], data seed."""
    from gflbench.data.manifest import register

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
    from gflbench.data.partition import DEFAULT_DATA_SEED

    label, counts, data_seed = _partition_file(path, datasets, clients, data_dir)
    if data_seed != DEFAULT_DATA_SEED:
        raise UserError(f"{path} was made at data seed {data_seed}; this command uses {DEFAULT_DATA_SEED}: "
                        "use `gflbench run --partition-file` (and its --data-seed)")  # fmt: skip
    return label, counts


def _check_rule(selection: str) -> None:
    from gflbench.paper import tables

    tables.check_rule(selection)


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


def _some(items: list[str], shown: int = 5) -> str:
    """The first few items of a list for a one-line message, and how many more there are."""
    more = len(items) - shown
    return "; ".join(items[:shown]) + (f"; and {more} more" if more > 0 else "")


def _table_numbers(number: str | None) -> list[int]:
    from gflbench.paper import tables

    if number is None:
        return [1, 2, 4, 5, 6, 7]
    if number == "all":
        return list(tables.ALL_TABLES)
    if not number.isdigit() or int(number) not in tables.ALL_TABLES:
        raise UserError(f"no table {number!r}; choose from 1-7 or all")
    return [int(number)]


def _chosen_methods(method: str | None, frame, registered: dict) -> list[str]:
    """The methods named on the command line (checked), else every registered method with stored runs, in paper order."""
    from gflbench.paper.tables import method_order

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
