"""`gflbench table`, `compare` and `report`: what the store holds, as the paper's tables, a comparison
with the published cells, or a static site.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Annotated

import typer

from gflbench.commands.common import (
    AlphaOption,
    DataDirOption,
    EpochsOption,
    FullSeedsOption,
    ParticipationOption,
    PartitionFileOption,
    ProtocolOption,
    RoundsOption,
    SelectionOption,
    SetOption,
    StoreOption,
    TestOption,
    TunedOption,
    _chosen_methods,
    _partition_file_at_default_seed,
    _plain,
    _say,
    _show,
    _stored_runs,
    _table_numbers,
    console,
    friendly,
    parse_ints,
    split_list,
)
from gflbench.data import dataset_spec, default_data_dir
from gflbench.errors import UserError
from gflbench.experiments.protocol import DEFAULT_PROTOCOL, check_protocol
from gflbench.experiments.store import DEFAULT_STORE, RunStore


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
    participation: ParticipationOption = 1.0,
    seeds: FullSeedsOption = 10,
    selection: SelectionOption = "global",
    value: Annotated[
        str, typer.Option(help="test, or val: the validation values settings are chosen by (never a result).")
    ] = "test",
    evaluate: Annotated[
        str,
        typer.Option(
            help="personalised: each client's model after local training; global: the global or cluster model each "
            "client starts a round from, before local training ('no global model' where a method has none). "
            "docs/protocol.md, 'Evaluation modes'."
        ),
    ] = "personalised",
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
    from gflbench.core.method import all_methods
    from gflbench.data.partition import DEFAULT_DATA_SEED, default_clients, scheme_label
    from gflbench.experiments.spec import check_participation, parse_overrides
    from gflbench.paper import planning, tables
    from gflbench.paper.significance import PairedTest

    check_protocol(protocol)
    check_participation(participation)
    paired = PairedTest(test, alpha)
    tables.check_format(fmt)
    tables.check_rule(selection)
    tables.check_value(value)
    tables.check_evaluation(evaluate, selection)
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
                               executions, participation, evaluate)  # fmt: skip
    rendered = []
    for n in numbers if not (number is None and chosen_datasets) else [0]:
        if n == 0:
            blocks, caption = (
                tables.results_table(0, sel, rows, titles, chosen_datasets, partition, paired, file_clients),
                f"{', '.join(chosen_datasets)}, {partition} partitioning",
            )
        elif n == 3:
            root = data_dir or default_data_dir()
            scheme = scheme_label(partition)
            counts = default_clients(scheme)
            blocks = [*tables.dataset_table(root), tables.partition_table(root, scheme, counts, DEFAULT_DATA_SEED)]
            caption = (
                f"{tables.CAPTIONS[3]} Below: the heterogeneity of their {scheme} partitions at "
                f"{', '.join(map(str, counts))} clients (data seed {DEFAULT_DATA_SEED}; client means, docs/protocol.md)."
            )
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
        if n != 3 and not any(
            (b.values.notna().any().any() or b.text.isin(["failed", tables.NO_GLOBAL_MODEL]).any().any())
            for b in blocks
        ):
            continue
        if selection != "global" and n not in (3, 7):
            caption = caption.rstrip(".") + (
                f". Selection: {selection} best validation round; methods that select "
                "inside themselves run with their own per-client selection on."
            )
        if value == "val" and n not in (3, 7):
            caption = caption.rstrip(".") + ". Values: VALIDATION (for choosing settings; not a result)."
        if n != 3:
            caption = sel.caption(caption, reading=n != 7)
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
    from gflbench.core.method import all_methods
    from gflbench.experiments.spec import parse_overrides
    from gflbench.paper import tables
    from gflbench.paper.compare import COMPARABLE_TABLES, to_markdown
    from gflbench.paper.compare import compare as compare_cells

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
    seeds: FullSeedsOption = 10,
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
    import tempfile

    from gflbench import report as site
    from gflbench.core.method import all_methods
    from gflbench.experiments.spec import parse_overrides
    from gflbench.paper.significance import PairedTest
    from gflbench.paper.tables import check_rule

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
            written = site.build(runs, out, options, force, _say)
    console.print(f"wrote {len(written)} files to {out}; open {out / 'index.html'}", soft_wrap=True)
