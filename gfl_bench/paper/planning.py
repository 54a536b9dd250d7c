"""What a command works out before anything runs or is read: the runs a sweep needs, the overrides a
selection rule implies, and, when a table finds nothing, the stored configurations nearest to it.

Library logic, not argument parsing: gfl_bench/commands/ parses and prints, these functions plan (issue 30, item 3,
"cli.py only wires commands"), and tests call them without a command line (tests/test_cli_planning.py).
Every bad input raises UserError here, before any work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gflbench.errors import UserError
from gflbench.experiments.protocol import DEFAULT_PROTOCOL

if TYPE_CHECKING:
    from gflbench.experiments.spec import RunSpec
    from gflbench.paper.sweep import Grid


def selected_overrides(set_: Sequence[str], methods: list[str], selection: str) -> dict[str, dict[str, str]]:
    """`--set` per method, plus what `--selection` switches on inside a method (tables.rule_overrides), so that
    a run and a table with the same rule meet the same runs."""
    from gflbench.experiments.spec import parse_overrides
    from gflbench.paper import tables

    return {
        m: tables.rule_overrides(m, selection, values) for m, values in parse_overrides(list(set_), methods).items()
    }


def check_snapshot_rounds(snapshots: frozenset[int], specs: Iterable[RunSpec]) -> None:
    """A snapshot round a run never reaches would be asked for again on every rerun, and never written."""
    for spec in specs:
        beyond = sorted(r for r in snapshots if not 0 <= r < spec.rounds)
        if beyond:
            raise UserError(f"--snapshot-rounds {','.join(map(str, beyond))}: {spec.method} on {spec.dataset} runs rounds "
                            f"0..{spec.rounds - 1}; give rounds inside that range")  # fmt: skip


def planned_device(device: str) -> str | None:
    """The device type a dry run plans for (None for auto: any measured row will do)."""
    return None if device == "auto" else device.split(":")[0]


def restricted_grid(grid: Grid, methods: Sequence[str] | None, datasets: Sequence[str] | None) -> Grid:
    """A paper table's grid restricted to the chosen methods and datasets (None: all of the grid's)."""
    from gflbench.data import dataset_spec
    from gflbench.paper.sweep import Grid

    for d in datasets or ():
        dataset_spec(d)
    return Grid(tuple(m for m in grid.methods if methods is None or m in methods),
                tuple(d for d in grid.datasets if datasets is None or d in datasets), grid.settings, grid.skipped)  # fmt: skip


def grid_run_specs(
    grid: Grid, seeds: int, set_: Sequence[str], selection: str, rounds: int | None = None,
    local_epochs: int | None = None, protocol: str = DEFAULT_PROTOCOL, tuned: Path | None = None,
) -> list[RunSpec]:  # fmt: skip
    """Every run of a grid, checked (seed count, client counts, each spec: `spec.make_spec`)."""
    from gflbench.data.partition import check_clients
    from gflbench.paper.sweep import grid_specs

    if seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {seeds}")
    for scheme, m in grid.settings:
        check_clients(scheme, m)
    overrides = selected_overrides(set_, list(grid.methods), selection)
    return grid_specs(grid, seeds, overrides, rounds, local_epochs, protocol, tuned)


def table_specs(
    table: str, registered: Sequence[str], methods: Sequence[str] | None, datasets: Sequence[str] | None, seeds: int,
    set_: Sequence[str], selection: str, rounds: int | None = None, local_epochs: int | None = None,
    protocol: str = DEFAULT_PROTOCOL, tuned: Path | None = None, part_of_all: bool = False,
) -> tuple[list[RunSpec], tuple[str, ...]]:  # fmt: skip
    """The runs one paper table (or, for "sensitivity", the sensitivity figures) needs, restricted to the chosen
    methods and datasets, and the table's methods this package lacks. `part_of_all`: `--table all -d X` takes
    X's sensitivity runs only where the paper has that figure."""
    from gflbench.paper.sweep import table_grid

    if table != "sensitivity":
        grid = restricted_grid(table_grid(table, registered), methods, datasets)
        return grid_run_specs(grid, seeds, set_, selection, rounds, local_epochs, protocol, tuned), grid.skipped
    from gflbench.data import dataset_spec
    from gflbench.paper.plots import SENSITIVITY_DATASETS, sensitivity_specs

    if methods is not None and "fedgmc" not in methods:
        return [], ()  # the figures vary FedGMC's parameters only
    chosen = list(datasets) if datasets is not None else list(SENSITIVITY_DATASETS)
    for d in chosen:
        dataset_spec(d)
    if part_of_all:
        chosen = [d for d in chosen if d in SENSITIVITY_DATASETS]
    return [s for d in chosen for s in sensitivity_specs(d, "metis", 10, seeds, rounds)], ()


def nearest_configurations(
    records: Iterable[Mapping[str, Any]], spec_of: Callable[[str, str, str, int], RunSpec | None], store: Path,
    number: str | None, shown: int = 3,
) -> str:  # fmt: skip
    """When a table finds no runs: the stored configurations closest to the one it asked for (`spec_of`, a
    `tables.Selection.spec_of`), fewest differing keys first, each with what differs and the `gflbench table`
    command that shows it. `records`: one record per stored configuration."""
    found = []
    for record in records:
        spec = spec_of(record["method"], record["dataset"], record["scheme"], record["clients"])
        wanted = spec.config() if spec is not None else {"params": {}}
        have = record["config"]
        differ = {k: v for k, v in have["params"].items() if wanted["params"].get(k) != v}
        for key in ("protocol", "rounds", "local_epochs"):
            if wanted.get(key) != have.get(key):
                differ[key] = have.get(key)
        args = [f"gflbench table {number or ''}".rstrip(), f"-d {record['dataset']}", f"--store {store}"]
        if have.get("protocol") not in (None, DEFAULT_PROTOCOL):
            args.append(f"--protocol {have['protocol']}")
        for key in ("rounds", "local_epochs"):
            if key in differ:
                args.append(f"--{key.replace('_', '-')} {differ[key]}")
        args += [f"--set {record['method']}.{k}={v}" for k, v in differ.items() if k in have["params"]]
        where = f"{record['method']} {record['dataset']} {record['scheme']}-{record['clients']}"
        text = ", ".join(f"{k}={v}" for k, v in differ.items()) or "same configuration, other cells"
        found.append((len(differ), f"{where} with {text}: `{' '.join(args)}`"))
    found.sort(key=lambda item: item[0])
    return "; ".join(text for _, text in found[:shown]) or "none"
