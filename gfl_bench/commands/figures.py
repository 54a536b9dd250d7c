"""`gflbench plot ...`: the paper's figures from stored runs (gfl_bench/paper/plots.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gflbench.commands.common import (
    AlphaOption,
    DatasetOption,
    EpochsOption,
    FigureOption,
    PartitionOption,
    ProtocolOption,
    RoundsOption,
    SelectionOption,
    SetOption,
    StoreOption,
    TunedOption,
    _chosen_methods,
    _stored_runs,
    console,
    friendly,
    parse_ints,
    split_list,
)
from gflbench.data import dataset_spec
from gflbench.errors import UserError
from gflbench.experiments.protocol import DEFAULT_PROTOCOL, check_protocol
from gflbench.experiments.store import DEFAULT_STORE, RunStore

FIGURES = Path("results") / "figures"


@friendly
def plot_convergence(
    dataset: DatasetOption,
    partition: PartitionOption = "metis",
    clients: Annotated[int, typer.Option()] = 10,
    method: Annotated[
        str | None, typer.Option("--method", "-m", help="Methods; default every stored one except the ablations.")
    ] = None,
    out: FigureOption = None,
    set_: SetOption = None,
    rounds: RoundsOption = None,
    local_epochs: EpochsOption = None,
    protocol: ProtocolOption = DEFAULT_PROTOCOL,
    tuned_dir: TunedOption = None,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Test metric per round, methods overlaid (paper Fig. 3, 6, 7; FedGMC's ablations only when named)."""
    from gflbench.core.method import all_methods
    from gflbench.data.partition import check_clients
    from gflbench.experiments.spec import parse_overrides
    from gflbench.paper import plots, tables

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


@friendly
def plot_sensitivity(
    dataset: DatasetOption,
    partition: PartitionOption = "metis",
    clients: Annotated[int, typer.Option()] = 10,
    out: FigureOption = None,
    rounds: RoundsOption = None,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """FedGMC's metric with std bars over Q, B, tau, eta (paper Fig. 4, 8, 9); runs from `sweep --table sensitivity`."""
    from gflbench.data.partition import check_clients
    from gflbench.paper import plots, tables

    dataset_spec(dataset)
    check_clients(partition, clients)
    sel = tables.Selection(_stored_runs(store), {}, rounds)
    _report_figure(
        plots.sensitivity(
            sel, dataset, partition, clients, out or FIGURES / f"sensitivity-{dataset}-{partition}-{clients}"
        )
    )


@friendly
def plot_case_study(
    dataset: DatasetOption,
    partition: PartitionOption = "metis",
    clients: Annotated[int, typer.Option()] = 10,
    seed: Annotated[int, typer.Option(help="Run seed of the FedGMC run.")] = 0,
    rounds_: Annotated[str, typer.Option("--at", help="Two snapshot rounds: before,after.")] = "0,99",
    set_: SetOption = None,
    rounds: RoundsOption = None,
    snapshot_dir: Annotated[Path, typer.Option(help="Where `run --snapshot-rounds` saved them.")] = Path("results")
    / "snapshots",
    out: FigureOption = None,
) -> None:
    """t-SNE of FedGMC's anchors, class means, templates and local structural manifolds at two rounds (Fig. 5)."""
    import torch

    from gflbench.experiments.spec import make_spec, parse_overrides
    from gflbench.paper import plots

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
    out: FigureOption = None,
    set_: SetOption = None,
    rounds: RoundsOption = None,
    local_epochs: EpochsOption = None,
    protocol: ProtocolOption = DEFAULT_PROTOCOL,
    tuned_dir: TunedOption = None,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Average ranks over a table's cells: Friedman's test and a Nemenyi critical-difference diagram."""
    from gflbench.core.method import all_methods
    from gflbench.data.partition import default_clients, scheme_label
    from gflbench.experiments.spec import parse_overrides
    from gflbench.paper import plots, significance, tables

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
