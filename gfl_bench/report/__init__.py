"""`gflbench report`: the leaderboard as one static site, every number with its provenance (docs/report.md).

The site is one `index.html` with its assets (a style sheet, a small script, SVG figures) in one folder:
it needs no network to be read, and it is a pure function of the run records, the package's data (the
paper's numbers, the preset files, the tuned files) and the options, so the same records give the same
bytes. The exceptions: the build stamp (`SOURCE_DATE_EPOCH` pins it, as in reproducible builds), and
the partitions section, which recomputes each shown partition's heterogeneity from the datasets where
they are present here (and says where they are not), checked against the partition hash the runs stored.

Nothing here computes a statistic or a table of its own: the tables are `gfl_bench.tables`' blocks with
`gfl_bench.significance`'s marks, the critical-difference diagram is `plots.ranks` on
`significance.rank_analysis`, the paper's values and sources come from `gfl_bench.compare`, and the
figures from `gfl_bench.plots` where it has them. What is new is the provenance of each cell (how its
number was read, its seeds, commits, command and hyperparameter sources), the per-client view and the
cost view, which read the stored records.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import math
import os
import re
import shlex
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from gfl_bench import plots, significance, tables  # plots selects matplotlib's file-only backend (Agg)
from gfl_bench.compare import compare
from gfl_bench.datasets import dataset_spec
from gfl_bench.errors import UserError
from gfl_bench.method import all_methods, method_class
from gfl_bench.paper import SOURCES
from gfl_bench.partition import scheme_title
from gfl_bench.presets import PresetRow, read_preset
from gfl_bench.protocol import DEFAULT_PROTOCOL, PROTOCOLS, read_tuned, tuned_dir, tuned_file
from gfl_bench.significance import BEST, FEW, PairedTest
from gfl_bench.spec import HARNESS_VERSION, RunSpec
from gfl_bench.store import RunStore, disagreements, read_records

MARKER = ".gflbench-report.json"  # in every report folder: what was written, so a rebuild may replace it
STAMP_ENV = "SOURCE_DATE_EPOCH"  # seconds since 1970 (UTC); pins the build stamp (reproducible-builds.org)
ASSETS = "assets"
STATIC = ("style.css", "report.js")  # copied from the templates as they are
# The sections the issue asks for that this report does not build yet (docs/report.md says why).
NOT_BUILT = (
    (
        "The grid's cost on a GPU (no GPU has measured bench/grid_cost.py's cells; no factor is assumed)",
        "GFLBENCH_RAW_MIRROR=... python bench/grid_cost.py --device cuda --out bench/grid_cost.csv",
    ),
)
CASE_STUDY_METHOD = "fedgmc"  # the paper's case study (Fig. 5, 10-15) shows FedGMC's manifolds
GRID_SEEDS = 10  # the paper's seeds per cell: the grid `gflbench sweep --table all` runs
GRID_COST_CSV = "grid_cost.csv"  # bench/: seconds per round of every method on every dataset (bench/grid_cost.py)
GRID_COST_PATH = f"bench/{GRID_COST_CSV}"
GRID_COST_BASE = ("metis", 10)  # the setting bench/grid_cost.py times every dataset at
GRID_COST_RATIO_DATASET = "cora"  # timed at every setting, to carry the others there
GRID_COST_REFERENCE = "fedavg"  # timed on every dataset first: a method not timed on a dataset is scaled from it


@dataclass(frozen=True)
class Options:
    """How the cells are chosen, as on `gflbench table`: the same options select the same runs."""

    overrides: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # --set, per method
    rounds: int | None = None
    local_epochs: int | None = None
    seeds: int = 10  # a full cell's seed count; others are marked (n=k)
    rule: str = "global"
    test: PairedTest = PairedTest()
    tuned: Path | None = None  # the `fair` protocol's tuned folder (None: the default one)
    protocol: str | None = None  # None: every protocol in the records, each its own leaderboard
    inputs: tuple[str, ...] = ()  # the store, or the records' files (sorted), as given: for the rebuild command
    from_records: bool = False  # whether `inputs` are exported records
    snapshots: Path | None = None  # where `gflbench run --snapshot-rounds` saved snapshots (None: not read)

    def argv(self) -> list[str]:
        """The options of `gflbench run`/`report` that select these configurations (not the protocol)."""
        args = []
        if self.rounds is not None:
            args += ["--rounds", str(self.rounds)]
        if self.local_epochs is not None:
            args += ["--local-epochs", str(self.local_epochs)]
        if self.tuned is not None:
            args += ["--tuned-dir", str(self.tuned)]
        if self.rule != "global":
            args += ["--selection", self.rule]
        return args


def check_protocols(text: str | None) -> str | None:
    """`--protocol`: one name, or none for all; a table shows one protocol, so a list is refused."""
    if text is None:
        return None
    names = [t.strip() for t in text.split(",") if t.strip()]
    if len(names) != 1:
        raise UserError(f"--protocol {text!r} asks for runs of several protocols in one table; a table shows one "
                        "protocol: give one, or leave --protocol out and every protocol gets its own leaderboard")  # fmt: skip
    if names[0] not in PROTOCOLS:
        raise UserError(f"unknown protocol {names[0]!r}; choose from {', '.join(PROTOCOLS)}")
    return names[0]


def stamp() -> datetime.datetime:
    """The build time: $SOURCE_DATE_EPOCH if set (a pinned, reproducible stamp), else now (UTC)."""
    text = os.environ.get(STAMP_ENV)
    if text is None:
        return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    try:
        return datetime.datetime.fromtimestamp(int(text), datetime.timezone.utc)
    except (ValueError, OverflowError, OSError):
        raise UserError(f"{STAMP_ENV} must be a whole number of seconds since 1970, got {text!r}") from None


def open_records(files: Sequence[Path], scratch: Path) -> RunStore:
    """Exported records in a scratch store, checked as `gflbench import` checks them (each record against
    itself, records of one run against each other), so that the report reads them as the tables do."""
    # in name order, whatever order the shell gave: a run in two files keeps the record of the last one
    imported = [item for path in sorted(files, key=str) for item in read_records(path)]
    clashes = disagreements(imported)
    if clashes:
        raise UserError(f"{len(clashes)} runs have records that disagree, first {clashes[0]}; no report was written")
    runs = RunStore(scratch / "runs.sqlite")
    runs.put_many(list({item.record["run_key"]: item.record for item in imported}.values()))
    return runs


def check_out(out: Path, force: bool) -> list[str]:
    """Refuse an output folder that exists, is not empty and is not a previous report (unless `force`);
    return the files a previous report there wrote (a rebuild removes them first)."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a folder; give a folder for the site")
    if not out.exists() or not any(out.iterdir()):
        return []
    marker = out / MARKER
    if not marker.is_file():
        if force:
            return []
        raise UserError(f"{out} exists and is not a gflbench report (no {MARKER} in it); nothing was written: "
                        "give another --out, or --force to write the site into it (other files there are kept)")  # fmt: skip
    try:
        written = json.loads(marker.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"{marker} is damaged; remove {out} (a previous report) or pass --force") from None
    return [name for name in written if isinstance(name, str)]


def build(runs: RunStore, out: Path, options: Options, force: bool = False) -> list[Path]:
    """Write the site for every stored run into `out`; returns the files written."""
    previous = check_out(out, force)
    # in run-key order, not the store's insertion order: a store and the records exported from it give one site
    frame = runs.frame().sort_values("run_key", ignore_index=True)
    if frame.empty:
        raise UserError("no stored runs to report (an empty store or empty records); run `gflbench run` first")
    frame["protocol"] = frame["protocol"].fillna(DEFAULT_PROTOCOL)  # runs stored before protocols were `paper`
    # the default protocol's leaderboard first (the paper's setting), then the others by name
    protocols = (
        [options.protocol]
        if options.protocol
        else sorted(set(frame["protocol"]), key=lambda p: (p != DEFAULT_PROTOCOL, p))
    )
    unknown = sorted(set(protocols) - set(PROTOCOLS))
    if unknown:
        raise UserError(f"the records hold runs of protocol {', '.join(unknown)}, which this gflbench does not know")
    if options.protocol and not (frame["protocol"] == options.protocol).any():
        raise UserError(
            f"no stored runs of protocol {options.protocol} (the records hold {', '.join(sorted(set(frame['protocol'])))})"
        )
    when = stamp()
    out.parent.mkdir(parents=True, exist_ok=True)
    # SVG text as text (the reader's sans-serif), not as glyph outlines: smaller files, selectable labels
    with (
        tempfile.TemporaryDirectory(prefix=f".{out.name}.", dir=out.parent) as folder,
        plt.rc_context({"svg.fonttype": "none"}),
    ):
        staged = Path(folder)
        files = _render(Site(staged, runs, frame, options), protocols, when, len(frame))
        for name in previous:  # a previous report's files: this build writes its own set
            path = out / name
            if path.is_file() and path.resolve().is_relative_to(out.resolve()):
                path.unlink()
        for path in files:  # only after the whole site was rendered: a failed build leaves `out` as it was
            target = out / path.relative_to(staged)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
    return [out / path.relative_to(staged) for path in files]


def _render(staging: Site, protocols: Sequence[str], when: datetime.datetime, runs: int) -> list[Path]:
    """Every file of the site, written under the staging folder; the marker last."""
    pages = [staging.protocol_page(p) for p in protocols]
    shown = {key for page in pages for key in page["run_keys"]}
    if not shown:
        other = staging.other_configurations(shown)
        raise UserError(f"none of the {runs} stored runs has the configuration the tables select; give the --set, "
                        f"--rounds, --local-epochs and --selection the runs were made with (stored: {other[0]}"
                        f"{f'; and {len(other) - 1} more configurations' if len(other) > 1 else ''})")  # fmt: skip
    context = {
        "stamp": when.strftime("%Y-%m-%d %H:%M UTC"),
        "stamp_epoch": int(when.timestamp()),
        "stamp_env": STAMP_ENV,
        "pages": pages,
        "runs": runs,
        "shown": len(shown),
        "other": staging.other_configurations(shown),
        "reproducibility": staging.reproducibility(shown),
        "grid": staging.grid_cost(),
        "partitions": staging.partitions(shown),
        "not_built": NOT_BUILT,
        "sources": SOURCES,
        "harness": HARNESS_VERSION,
    }
    written = staging.write(context)
    marker = staging.out / MARKER
    marker.write_text(json.dumps({"files": sorted(p.relative_to(staging.out).as_posix() for p in written),
                                  "stamp_epoch": context["stamp_epoch"]}, indent=1) + "\n")  # fmt: skip
    return [*written, marker]


def _slug(*parts: object) -> str:
    text = "-".join(str(p) for p in parts).replace("+", "plus")
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _pct(value: float | None, decimals: int = 2) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{decimals}f}"


def _utc(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _metric(dataset: str) -> str:
    return "ROC-AUC" if dataset_spec(dataset).metric == "roc_auc" else "accuracy"


def _scheme_words(scheme: str) -> str:
    """The paper's words for its two schemes; a new scheme (louvain, dirichlet-α, a split file) by its title."""
    return "non-overlapping (METIS)" if scheme == "metis" else scheme_title(scheme)


class Site:
    """One report being built: the selections per protocol, the figures written so far, the cells shown."""

    def __init__(self, out: Path, runs: RunStore, frame: pd.DataFrame, options: Options) -> None:
        self.out = out
        self.runs = runs
        self.frame = frame
        self.options = options
        self.registered = all_methods()
        self.titles = {m: cls.title for m, cls in self.registered.items()}
        self.figures: list[Path] = []
        self._records: dict[str, dict] = {}
        # seconds per round as the store computes it (store.round_seconds: on records with a first round timed
        # apart, the median of the later rounds), the number Table 7 shows
        self.seconds = dict(zip(frame["run_key"], frame["seconds_per_round"]))

    # ---- reading

    def records(self, keys: Iterable[str]) -> list[dict]:
        """Full records by run key, each read from the store once."""
        keys = list(keys)
        missing = [k for k in keys if k not in self._records]
        for record in self.runs.records(missing):
            self._records[record["run_key"]] = record
        return [self._records[k] for k in keys if k in self._records]

    def selection(self, protocol: str) -> tables.Selection:
        """The tables' selection of one protocol's runs (the others could never match its configuration keys)."""
        o = self.options
        runs = self.frame[self.frame["protocol"] == protocol]
        return tables.Selection(runs, o.overrides, o.rounds, o.local_epochs, o.seeds, o.rule, protocol, o.tuned)

    def cells(self, sel: tables.Selection, methods: Sequence[str]) -> list[tuple[str, str, str, int]]:
        """Every (method, dataset, scheme, clients) of the protocol with stored runs of the selected configuration."""
        stored = self.frame[self.frame["protocol"] == sel.protocol]
        settings = stored[["method", "dataset", "scheme", "clients"]].drop_duplicates().itertuples(index=False)
        found = [(m, d, s, int(c)) for m, d, s, c in settings if m in methods and len(sel.runs_of(m, d, s, int(c)))]
        order = {m: i for i, m in enumerate(methods)}
        return sorted(found, key=lambda cell: (cell[1], cell[2], cell[3], order[cell[0]]))

    # ---- one protocol

    def protocol_page(self, protocol: str) -> dict[str, Any]:
        sel = self.selection(protocol)
        stored = self.frame[self.frame["protocol"] == protocol]
        methods = tables.method_order([m for m in stored["method"].unique() if m in self.registered])
        rows = [m for m in methods if m not in tables.ABLATIONS]
        cells = self.cells(sel, methods)
        paper = compare(sel, rows, tables=(1, 2, 4, 5)).cells
        paper_index = {
            (int(r.table), r.method, r.dataset, r.scheme, int(r.clients)): r for r in paper.itertuples(index=False)
        }
        provenance = {cell: self.provenance(sel, *cell) for cell in cells}
        boards = [self.board(sel, n, rows, provenance, paper_index) for n in self._table_numbers(stored)]
        boards = [b for b in boards if b is not None]
        ablations = self.ablations(sel, stored)
        settings = sorted({(d, s, c) for _, d, s, c in cells})
        return {
            "name": protocol,
            "id": _slug(protocol),
            "description": PROTOCOLS[protocol],
            "hyperparameters": tables.hyperparameter_source(protocol, self.options.tuned),
            "boards": boards,
            "ablations": ablations,
            "provenance": [provenance[c] for c in cells],
            "cost": self.cost(sel, protocol, cells, settings),
            "clients": self.client_view(sel, protocol, cells, settings),
            "convergence": self.convergence(sel, protocol, methods, settings),
            "sensitivity": self.sensitivity(sel, protocol, stored),
            "run_keys": sorted({k for p in provenance.values() for k in p["run_keys"]}),
        }

    @staticmethod
    def _table_numbers(stored: pd.DataFrame) -> list[int | tuple[str, tuple[str, ...]]]:
        """Tables 1, 2, 4, 5, then one table per scheme of the datasets no paper table has (e.g. `tiny`)."""
        paper_datasets = set(tables.HOMOPHILIC + tables.HETEROPHILIC)
        others = []
        for scheme in tables.CLIENTS:
            datasets = sorted(set(stored.loc[stored["scheme"] == scheme, "dataset"]) - paper_datasets)
            if datasets:
                others.append((scheme, tuple(datasets)))
        return [*tables.RESULT_TABLES, *others]

    def board(self, sel: tables.Selection, number: int | tuple[str, tuple[str, ...]], rows: Sequence[str],
              provenance: Mapping[tuple, dict], paper_index: Mapping[tuple, Any]) -> dict[str, Any] | None:  # fmt: skip
        """One results table: its blocks as HTML-ready rows, with marks, the paper's values and links to provenance."""
        test = self.options.test
        datasets, scheme = tables.result_cells(number) if isinstance(number, int) else number[::-1]
        stored = sel.runs[(sel.runs["scheme"] == scheme) & sel.runs["dataset"].isin(datasets)]
        rows = [m for m in rows if (stored["method"] == m).any()]  # a method without runs here is no row (and is slow)
        if not rows:
            return None
        if isinstance(number, int):
            blocks = tables.results_table(number, sel, rows, self.titles, test=test)
            caption, datasets, scheme, table = tables.CAPTIONS[number], *tables.result_cells(number), number
        else:
            scheme, datasets = number
            blocks = tables.results_table(0, sel, rows, self.titles, list(datasets), scheme, test)
            caption, table = (
                f"Datasets in no paper table ({', '.join(datasets)}), {_scheme_words(scheme)} partitioning.",
                0,
            )
        if not any(b.values.notna().any().any() or (b.text == "failed").any().any() for b in blocks):
            return None
        caption = sel.caption(caption)
        if sel.rule != "global":
            caption = caption.rstrip(".") + f". Selection: {sel.rule} best validation round."
        by_title = {(dataset_spec(d).title, f"{c} Clients"): (d, c) for d in datasets for c in tables.CLIENTS[scheme]}
        label_of = dict(zip(rows, blocks[0].text.index))
        rendered = []
        for i, block in enumerate(blocks):
            rendered.append(
                self._block(block, rows, label_of, by_title, scheme, table, provenance, paper_index, sel, i)
            )
        board_id = _slug(sel.protocol, f"table-{table}" if table else f"other-{scheme}")
        return {
            "id": board_id,
            "title": f"Table {table}" if table else f"Other datasets ({scheme})",
            "caption": caption,
            "legend": test.describe(),
            "blocks": rendered,
            "cd": self.cd_diagram(sel, rows, datasets, scheme, board_id),
        }

    def _block(self, block: tables.Block, rows: Sequence[str], label_of: Mapping[str, str],
               by_title: Mapping[tuple[str, str], tuple[str, int]], scheme: str, table: int,
               provenance: Mapping[tuple, dict], paper_index: Mapping[tuple, Any], sel: tables.Selection,
               index: int) -> dict[str, Any]:  # fmt: skip
        columns = list(block.text.columns)
        second = self._second(block, columns)
        groups: list[list] = []
        for group, _ in columns:
            if groups and groups[-1][0] == group:
                groups[-1][1] += 1
            else:
                groups.append([group, 1])
        body = []
        for method in rows:
            label = label_of[method]
            if label not in block.text.index or not any(block.text.loc[label]):
                continue  # no runs of this method in these columns
            entries = []
            for column in columns:
                text = block.text.loc[label, column]
                mark = block.marks.loc[label, column] if block.marks is not None else None
                entry: dict[str, Any] = {"text": text, "classes": [], "href": None, "title": "", "paper": None}
                if mark is not None:
                    entry["classes"].append({BEST: "best", FEW: "few"}.get(mark.verdict, mark.verdict))
                    if not math.isnan(mark.p):
                        entry["title"] = (
                            f"Holm-adjusted p against the column's best: {mark.p:.3g} ({mark.n} paired seeds)"
                        )
                if second.get(column) == label:
                    entry["classes"].append("second")
                setting = by_title.get(column)
                if setting is not None and text:
                    d, c = setting
                    cell = provenance.get((method, d, scheme, c))
                    if cell is not None:
                        entry["href"] = f"#cell-{cell['id']}"
                        entry["title"] = "; ".join(filter(None, (cell["hover"], entry["title"])))
                    published = paper_index.get((table, method, d, scheme, c))
                    if published is not None:
                        entry["paper"] = {
                            "text": f"{published.paper:.2f}" + ("" if math.isnan(published.paper_std) else f"±{published.paper_std:.2f}"),
                            "source": published.source,
                            "flag": bool(published.flag),
                            "gap": f"{published.gap:+.2f}",
                        }  # fmt: skip
                        if cell is not None:
                            cell["paper"] = {**entry["paper"], "source_text": SOURCES[published.source], "table": table}
                entries.append(entry)
            body.append({"label": label, "cells": entries})
        return {"groups": groups, "columns": columns, "rows": body, "continued": index > 0}

    @staticmethod
    def _second(block: tables.Block, columns: Sequence[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """Per tested column, the row with the highest mean after the best among the tested entries (not `few`)."""
        second = {}
        if block.marks is None:
            return second
        for column in columns:
            marks = block.marks[column]
            tested = [label for label, m in marks.items() if m is not None and m.verdict not in (BEST, FEW)]
            if tested:
                second[column] = max(tested, key=lambda label: block.values.loc[label, column])
        return second

    def cd_diagram(self, sel: tables.Selection, rows: Sequence[str], datasets: Sequence[str], scheme: str,
                   board_id: str) -> dict[str, str]:  # fmt: skip
        """The critical-difference diagram over a table's cells, as `gflbench plot ranks` draws it, or why not."""
        cells = [(d, scheme, c) for d in datasets for c in tables.CLIENTS[scheme]]
        means, dropped_methods, dropped_cells = significance.cell_means(sel, rows, cells, named=False)
        left_out = "; ".join(dropped_methods + dropped_cells) or "none"
        try:
            analysis = significance.rank_analysis(means, self.options.test.alpha)
        except UserError as error:
            return {"missing": f"No critical-difference diagram: {error} (at least {significance.RANK_MIN_SEEDS} "
                               f"seeds each; left out: {left_out})."}  # fmt: skip
        caption = significance.rank_caption(analysis, sel.protocol, sel.rule, left_out)
        path = self._figure(lambda out: plots.ranks(analysis, self.titles, caption, out, (".svg",)), f"cd-{board_id}")
        return {"src": path, "caption": caption}

    def _figure(self, draw, stem: str) -> str | None:
        """Draw a figure as SVG under assets/; its path relative to the site, or None when nothing was drawn."""
        written = draw(self.out / ASSETS / stem)
        if not written:
            return None
        self.figures.extend(written)
        return f"{ASSETS}/{stem}.svg"

    def ablations(self, sel: tables.Selection, stored: pd.DataFrame) -> dict[str, Any] | None:
        """Table 6 as `gflbench table 6` builds it, for the datasets with ablation runs."""
        datasets = [d for d in tables.HOMOPHILIC + tables.HETEROPHILIC
                    if ((stored["dataset"] == d) & stored["method"].isin(tables.ABLATIONS)).any()]  # fmt: skip
        if not datasets:
            return None
        blocks = tables.ablation_table(sel, self.titles, datasets)
        if not any(b.values.notna().any().any() for b in blocks):
            return None
        return {"caption": sel.caption(tables.CAPTIONS[6]), "html": [_plain_table(b.text) for b in blocks]}

    # ---- provenance of one cell

    def provenance(self, sel: tables.Selection, method: str, dataset: str, scheme: str, clients: int) -> dict[str, Any]:
        """Everything a reader needs to trust or redo one cell."""
        spec = sel.spec_of(method, dataset, scheme, clients)
        assert spec is not None  # the cell has runs of this configuration
        chosen = sel.runs_of(method, dataset, scheme, clients)
        records = sorted(self.records(chosen["run_key"]), key=lambda r: r["seed"])
        ok = [r for r in records if r.get("status", "ok") == "ok"]
        column = "test" + tables.SELECTION_RULES[sel.rule]
        seeds = [{
            "seed": r["seed"], "status": r.get("status", "ok"),
            "value": _pct(100 * r[column]) if r.get(column) is not None else "",
            "best_round": "" if r.get("best_round") is None else f"{r['best_round'] + 1} of {len(r['curves']['test'])}",
            "excluded": ", ".join(f"{k}: {v}" for k, v in sorted((r.get("excluded_clients") or {}).items()) if v) or "none",
            "run_key": r["run_key"], "finished": _utc(r.get("finished_at")), "commit": r.get("git_commit", "unknown"),
            "device": f"{r.get('device', '?')} ({r.get('device_name', '?')})", "error": r.get("error", ""),
        } for r in records]  # fmt: skip
        cell = sel.cell(method, dataset, scheme, clients)
        metric = _metric(dataset)
        seed_list = [r["seed"] for r in records]
        command = self.command(sel, spec, max(seed_list) + 1)
        commits = sorted({r.get("git_commit", "unknown") for r in records})
        versions = sorted({r.get("versions", {}).get("gflbench", "?") for r in records})
        cell_id = _slug(sel.protocol, method, dataset, scheme, clients)
        reading = _reading(sel.rule, metric, clients)
        hover = (f"{self.titles[method]}, {dataset_spec(dataset).title} {scheme}-{clients}: {metric}, {reading['short']}; "
                 f"seeds {', '.join(map(str, seed_list))}; commit {', '.join(c[:10] for c in commits)}; click for provenance")  # fmt: skip
        return {
            "id": cell_id,
            "title": f"{self.titles[method]} on {dataset_spec(dataset).title}, {_scheme_words(scheme)}, {clients} clients "
            f"(protocol {sel.protocol})",
            "hover": hover,
            "value": sel.format(cell) if cell else "",
            "metric": metric,
            "reading": reading["long"],
            "seeds": seeds,
            "seed_list": ", ".join(map(str, seed_list)),
            "commits": commits,
            "harness": spec.config()["harness"],
            "versions": versions,
            "command": command,
            "hyperparameters": self.hyperparameters(sel, spec),
            "schedule": f"{spec.rounds} rounds × {spec.local_epochs} local epochs",
            "config_key": spec.config_key,
            "run_keys": [r["run_key"] for r in records],
            "ok": len(ok),
            "paper": None,  # filled in by the board that shows the cell, where the paper has it
            "case_study": self.case_study(sel, spec, ok, cell_id) if method == CASE_STUDY_METHOD else None,
        }

    def case_study(self, sel: tables.Selection, spec: RunSpec, ok: Sequence[dict], cell_id: str) -> dict[str, Any]:
        """The paper's case-study figure (Fig. 5: t-SNE of FedGMC's global and local, semantic and structural
        manifolds before and after refinement) for the cell's lowest finished seed, at its first and last round.
        Records hold no manifolds: `gflbench run --snapshot-rounds` saves them as files, which the report reads
        from `Options.snapshots`. Without them the cell says what is missing and the commands that make it."""
        at = (0, spec.rounds - 1)
        if not ok:
            return {"src": None, "missing": "No case-study figure: the cell has no finished run.", "commands": []}
        record = ok[0]
        run = f"{self.command(sel, spec, record['seed'] + 1)} --snapshot-rounds {at[0]},{at[1]}"
        commands = [run]
        if sel.protocol == DEFAULT_PROTOCOL and self.options.local_epochs is None:  # what `plot case-study` can select
            plot = ["gflbench", "plot", "case-study", "-d", spec.dataset, "--partition", spec.scheme, "--clients",
                    str(spec.clients), "--seed", str(record["seed"]), "--at", f"{at[0]},{at[1]}"]  # fmt: skip
            plot += ["--rounds", str(self.options.rounds)] if self.options.rounds is not None else []
            plot += [
                f"--set={spec.method}.{k}={v}" for k, v in sorted(self.options.overrides.get(spec.method, {}).items())
            ]
            commands.append(shlex.join(plot))
        folder = None if self.options.snapshots is None else self.options.snapshots / record["run_key"]
        paths = [] if folder is None else [folder / f"round{r}.pt" for r in at]
        absent = [p.name for p in paths if not p.is_file()]
        if folder is None or absent:
            reason = ("this report was built without a snapshot folder" if folder is None
                      else f"{folder} lacks {', '.join(absent)}")  # fmt: skip
            return {"src": None, "missing": f"No case-study figure: it reads FedGMC's manifolds at rounds {at[0] + 1} and {at[1] + 1} "
                               f"of run {record['run_key']} (seed {record['seed']}), which run records do not hold, and "
                               f"{reason}. These commands make the snapshots (into results/snapshots) and the figure:",
                    "commands": commands}  # fmt: skip
        import torch

        before, after = (torch.load(p, weights_only=True) for p in paths)
        title = (f"FedGMC on {dataset_spec(spec.dataset).title}, {_scheme_words(spec.scheme)}, {spec.clients} clients, "
                 f"seed {record['seed']}: rounds {at[0] + 1} and {at[1] + 1}")  # fmt: skip
        src = self._figure(lambda out: plots.case_study(before, after, title, out, (".svg",)), f"case-study-{cell_id}")
        return {"src": src, "missing": "", "caption": f"{title}. Stars: the global anchors (top, by class) and structural templates "
                f"(bottom); dots: each client's calibrated class means (by class) and sampled local structural manifolds "
                f"(by assigned template). From {folder}/round{at[0]}.pt and round{at[1]}.pt.", "commands": commands}  # fmt: skip

    def command(self, sel: tables.Selection, spec: RunSpec, seeds: int) -> str:
        """The `gflbench run` command whose runs are this cell's (same configuration key, seeds 0..N-1)."""
        args = ["gflbench", "run", "-m", spec.method, "-d", spec.dataset, "--partition", spec.scheme,
                "--clients", str(spec.clients), "--seeds", str(seeds)]  # fmt: skip
        if sel.protocol != DEFAULT_PROTOCOL:
            args += ["--protocol", sel.protocol]
        args += self.options.argv()
        args += [f"--set={spec.method}.{k}={v}" for k, v in sorted(self.options.overrides.get(spec.method, {}).items())]
        return shlex.join(args)

    def hyperparameters(self, sel: tables.Selection, spec: RunSpec) -> list[dict[str, str]]:
        """Every resolved value of the cell's configuration with where it came from."""
        cls = method_class(spec.method)
        given = tables.rule_overrides(spec.method, sel.rule, self.options.overrides.get(spec.method, {}))
        preset = _preset_rows(cls, spec.dataset, spec.scheme, spec.clients)
        tuned_values, tuned_note = {}, ""
        if sel.protocol == "fair":
            folder = tuned_dir(self.options.tuned)
            entry = read_tuned(folder, spec.dataset, spec.scheme, spec.clients).get("methods", {}).get(spec.method, {})
            tuned_values = {k: str(v) for k, v in entry.get("values", {}).items()}
            budget, trials = entry.get("budget", {}), entry.get("trials", {})
            tuned_note = (f"tuned: {tuned_file(folder, spec.dataset, spec.scheme, spec.clients)} (trial {entry.get('trial', '?')}; "
                          f"budget {budget.get('trials', '?')} trials, {budget.get('sampler', '?')}, pruner "
                          f"{budget.get('pruner', '?')}, tuning seeds {budget.get('tuning_seeds', '?')}; trials run "
                          f"{', '.join(f'{k} {v}' for k, v in trials.items()) or '?'})")  # fmt: skip
        default = f"{cls.__name__}.Params default ({cls.__module__})"
        rows = []
        for key, value in dataclasses.asdict(spec.params).items():
            if key in given:
                source = "--set" if key in self.options.overrides.get(spec.method, {}) else f"--selection {sel.rule}"
            elif key in tuned_values:
                source = tuned_note
            elif key in preset:
                source = _preset_source(cls, preset[key])
            else:
                source = default
            rows.append({"key": key, "value": str(value), "source": source})
        data = dataset_spec(spec.dataset)
        for key, value, own in (
            ("rounds", spec.rounds, data.rounds),
            ("local_epochs", spec.local_epochs, data.local_epochs),
        ):
            if getattr(self.options, key) is not None:
                source = f"--{key.replace('_', '-')}"
            elif key in preset and sel.protocol == "paper":
                source = _preset_source(cls, preset[key])
            else:
                source = f"the dataset's schedule (gfl_bench/datasets.py, {spec.dataset}: {own})"
            rows.append({"key": key, "value": str(value), "source": source})
        return rows

    # ---- views over cells

    def cost(
        self, sel: tables.Selection, protocol: str, cells: Sequence[tuple], settings: Sequence[tuple]
    ) -> dict[str, Any]:
        """Seconds, bytes and memory per round per cell, and accuracy against communication and time per setting."""
        rows = []
        points: dict[tuple, list[dict]] = {}
        for method, d, s, c in cells:
            ok = sorted((r for r in self.records(sel.run_keys(method, d, s, c)) if r.get("status", "ok") == "ok"),
                        key=lambda r: r["seed"])  # fmt: skip
            if not ok:
                continue
            column = "test" + tables.SELECTION_RULES[sel.rule]
            value = float(np.mean([math.nan if r.get(column) is None else r[column] for r in ok])) * 100
            per_round = float(np.mean([self.seconds[r["run_key"]] for r in ok]))  # the store's column, as Table 7
            traffic = [np.asarray(r["bytes_up"], float) + np.asarray(r["bytes_down"], float) for r in ok]
            peaks = [r["peak_memory_bytes"] for r in ok if r.get("peak_memory_bytes")]
            total_seconds = float(np.mean([np.sum(r["seconds_per_round"]) for r in ok]))
            total_bytes = float(np.mean([t.sum() for t in traffic]))
            row = {
                "method": self.titles[method], "setting": f"{dataset_spec(d).title} {s}-{c}", "seeds": len(ok),
                "value": _pct(value), "seconds": f"{per_round:.3f}", "mb_round": f"{np.mean([t.mean() for t in traffic]) / 2**20:.2f}",
                "peak": f"{np.mean(peaks) / 2**20:.0f}" if peaks else "", "total_seconds": f"{total_seconds:.1f}",
                "total_mb": f"{total_bytes / 2**20:.1f}", "devices": ", ".join(sorted({r.get("device_name", "?") for r in ok})),
            }  # fmt: skip
            rows.append(row)
            points.setdefault((d, s, c), []).append({"method": self.titles[method], "value": value,
                                                     "mb": total_bytes / 2**20, "seconds": total_seconds})  # fmt: skip
        figures = []
        for setting in settings:
            if setting not in points:
                continue
            d, s, c = setting
            stem = f"cost-{_slug(protocol, d, s, c)}"
            path = self._figure(lambda out, p=points[setting], st=setting: _cost_figure(p, st, out), stem)
            figures.append({"src": path, "caption": f"{dataset_spec(d).title}, {_scheme_words(s)}, {c} clients: "
                            f"mean test {_metric(d)} over seeds against the bytes communicated (up + down, all clients, "
                            "all rounds) and against the training time (sum of seconds per round, evaluation excluded)."})  # fmt: skip
        return {"rows": rows, "figures": figures}

    def client_view(
        self, sel: tables.Selection, protocol: str, cells: Sequence[tuple], settings: Sequence[tuple]
    ) -> dict[str, Any]:
        """Per cell, the spread of the clients' test values at each run's best round, the worst client, and the
        fraction of clients below Local (same seed, same client, Local at its own best round)."""
        values: dict[tuple, dict[int, np.ndarray]] = {}
        for method, d, s, c in cells:
            per_seed = {}
            for r in self.records(sel.run_keys(method, d, s, c)):
                if r.get("status", "ok") == "ok" and r.get("client_curves"):
                    row = r["client_curves"]["test"][r["best_round"]]
                    per_seed[r["seed"]] = np.array([math.nan if v is None else v for v in row], float) * 100
            if per_seed:
                values[(method, d, s, c)] = dict(sorted(per_seed.items()))  # seed order: the same sums every build
        rows, figures = [], []
        for (method, d, s, c), per_seed in values.items():
            local = values.get(("local", d, s, c), {})
            shared = sorted(set(per_seed) & set(local)) if method != "local" else []
            below = [float(np.nanmean(per_seed[k] < local[k])) for k in shared
                     if np.isfinite(per_seed[k]).any() and np.isfinite(local[k]).any()]  # fmt: skip
            rows.append({
                "method": self.titles[method], "setting": f"{dataset_spec(d).title} {s}-{c}", "seeds": len(per_seed),
                "mean": _pct(np.mean([np.nanmean(v) for v in per_seed.values()])),
                "spread": _pct(np.mean([np.nanstd(v) for v in per_seed.values()])),
                "range": _pct(np.mean([np.nanmax(v) - np.nanmin(v) for v in per_seed.values()])),
                "worst": _pct(np.mean([np.nanmin(v) for v in per_seed.values()])),
                "worst_ever": _pct(min(np.nanmin(v) for v in per_seed.values())),
                "below_local": "" if method == "local" else (f"{100 * np.mean(below):.0f}% ({len(below)} seeds)" if below else "no Local runs"),
            })  # fmt: skip
        for setting in settings:
            boxes = {self.titles[m]: np.concatenate([v[seed] for seed in sorted(v)])
                     for (m, *rest), v in values.items() if tuple(rest) == setting}  # fmt: skip
            if not boxes:
                continue
            d, s, c = setting
            stem = f"clients-{_slug(protocol, d, s, c)}"
            path = self._figure(lambda out, b=boxes, st=setting: _client_figure(b, st, out), stem)
            figures.append({"src": path, "caption": f"{dataset_spec(d).title}, {_scheme_words(s)}, {c} clients: every "
                            f"client's test {_metric(d)} at its run's best round, all seeds pooled, one box per method."})  # fmt: skip
        return {"rows": rows, "figures": figures}

    def convergence(
        self, sel: tables.Selection, protocol: str, methods: Sequence[str], settings: Sequence[tuple]
    ) -> list[dict]:
        """`gflbench plot convergence` per setting, as SVG."""
        figures = []
        for d, s, c in settings:
            stem = f"convergence-{_slug(protocol, d, s, c)}"
            path = self._figure(
                lambda out, st=(d, s, c): plots.convergence(self.runs, sel, methods, self.titles, *st, out, (".svg",)),
                stem,
            )
            if path:
                figures.append({"src": path, "caption": f"{dataset_spec(d).title}, {_scheme_words(s)}, {c} clients: "
                                f"client-mean test {_metric(d)} per round, mean ± std over seeds."})  # fmt: skip
        return figures

    def sensitivity(self, sel: tables.Selection, protocol: str, stored: pd.DataFrame) -> list[dict]:
        """`gflbench plot sensitivity` (FedGMC over Q, B, tau, eta; `paper` only, as that command reads) for each
        setting where FedGMC has runs of more than one configuration: with one, every panel is its single point."""
        if protocol != DEFAULT_PROTOCOL:
            return []
        fedgmc = stored[stored["method"] == "fedgmc"]
        varied = fedgmc.groupby(["dataset", "scheme", "clients"])["config_key"].nunique()
        figures = []
        for (d, s, c), count in sorted(varied.items()):
            if count < 2:
                continue
            stem = f"sensitivity-{_slug(protocol, d, s, c)}"
            path = self._figure(lambda out, st=(d, s, int(c)): plots.sensitivity(sel, *st, out, (".svg",)), stem)
            if path:
                figures.append({"src": path, "caption": f"{dataset_spec(d).title}, {_scheme_words(s)}, {c} clients: FedGMC's "
                                f"test {_metric(d)} as each of Q, B, tau, eta varies around its default (mean ± std over seeds)."})  # fmt: skip
        return figures

    # ---- the whole site

    def other_configurations(self, shown: set[str]) -> list[str]:
        """Stored runs no page shows (another --set, schedule or selection): one line per configuration."""
        rest = self.frame[~self.frame["run_key"].isin(shown)]
        lines = []
        for (protocol, method, key), group in rest.groupby(["protocol", "method", "config_key"], sort=True):
            settings = sorted({f"{d} {s}-{c}" for d, s, c in zip(group["dataset"], group["scheme"], group["clients"])})
            lines.append(f"{protocol} · {method} · configuration {key}: {len(group)} runs ({', '.join(settings)})")
        return lines

    def grid_cost(self) -> dict[str, Any]:
        """What `gflbench sweep --table all` (protocol paper, seeds 0-9) still has to run, and how long that takes by
        `sweep.estimate` (the stored runs' seconds per round, else bench/round_times.csv), per table and in all.
        One estimate for the whole grid; a table's share of a cell is its runs' share (a cell's runs have one schedule)."""
        from gfl_bench.execute import pending
        from gfl_bench.sweep import SWEEP_TABLES, estimate, grid_specs, load_round_times, table_grid

        registered = list(self.registered)
        parts = {f"Table {t}": grid_specs(table_grid(t, registered), GRID_SEEDS, {}) for t in SWEEP_TABLES}
        parts["Sensitivity"] = [
            s for d in plots.SENSITIVITY_DATASETS for s in plots.sensitivity_specs(d, "metis", 10, GRID_SEEDS)
        ]
        keyed = {name: {s.run_key: s for s in specs} for name, specs in parts.items()}
        every = {key: spec for specs in keyed.values() for key, spec in specs.items()}
        key_of = {id(spec): key for key, spec in every.items()}
        todo = pending(list(every.values()), self.runs, False, False)
        missing = {key_of[id(spec)]: spec for spec in todo}
        measured = load_round_times()
        plan = estimate(todo, self.frame, measured, device="cpu")
        cells = zip(
            plan["method"], plan["dataset"], plan["scheme"], plan["clients"], plan["est. seconds"], plan["runs"]
        )
        per_run = {
            (m, d, sc, c): seconds / runs for m, d, sc, c, seconds, runs in cells if runs and not math.isnan(seconds)
        }
        rows = []
        for name, specs in [*keyed.items(), ("All (each run once)", every)]:
            known = [per_run[cell] for key in specs if key in missing
                     if (cell := (specs[key].method, specs[key].dataset, specs[key].scheme, specs[key].clients)) in per_run]  # fmt: skip
            rows.append({"name": name, "runs": len(specs), "missing": sum(key in missing for key in specs),
                         "with_basis": len(known), "hours": f"{sum(known) / 3600:.1f}"})  # fmt: skip
        devices = sorted(set(measured["device"].astype(str).str.split(":").str[0])) if len(measured) else []
        return {"rows": rows, "seeds": GRID_SEEDS, "measured_devices": ", ".join(devices) or "none",
                "gpu": "cuda" in devices, "whole": whole_grid_cost(keyed, every)}  # fmt: skip

    def partitions(self, shown: set[str]) -> list[dict[str, Any]]:
        """Every partition the shown runs trained on, with its heterogeneity (`heterogeneity.setting_summary`).
        Records hold no node assignment, so it is remade from the data (cached as `gflbench run` caches it) and
        shown only when its hash is the runs'; where the data is absent here, or the remade partition differs,
        the row says so instead of showing numbers that may not be the runs' partition."""
        from gfl_bench import heterogeneity
        from gfl_bench.datasets import default_data_dir
        from gfl_bench.runner import DataCache

        settings = sorted({(r["dataset"], r["scheme"], int(r["clients"]), int(r["data_seed"]), r.get("partition_hash"))
                           for r in self.records(sorted(shown))})  # fmt: skip
        root = default_data_dir()
        cache = DataCache(root, root / "partitions")
        rows = []
        for dataset, scheme, clients, data_seed, digest in settings:
            row: dict[str, Any] = {"dataset": dataset_spec(dataset).title, "scheme": _scheme_words(scheme),
                                   "clients": clients, "data_seed": data_seed, "hash": digest or "not stored", "absent": ""}  # fmt: skip
            try:
                data = cache.federated(dataset, scheme, clients, data_seed)
            except (UserError, OSError) as error:  # the dataset is not on this machine (no download here)
                rows.append({**row, "absent": f"not recomputed: {error}"})
                continue
            if digest is not None and data.partition.digest() != digest:
                rows.append(
                    {**row, "absent": f"the partition remade here has hash {data.partition.digest()}, not the runs'"}
                )
                continue
            summary = heterogeneity.setting_summary(cache.graph(dataset), data.graphs)
            rows.append({**row, **{name: f"{value:+.3f}" if name == "homophily_gap" else f"{value:.3f}"
                                   for name, value in summary.items()}})  # fmt: skip
        return rows

    def reproducibility(self, shown: set[str]) -> dict[str, Any]:
        records = self.records(sorted(shown))
        versions: dict[str, Counter] = {}
        for r in records:
            for name, version in sorted(r.get("versions", {}).items()):
                versions.setdefault(name, Counter())[version] += 1
        count = lambda values: sorted(Counter(values).items())
        given = self.options.inputs
        inputs = [{"path": name, "sha256": hashlib.sha256(Path(name).read_bytes()).hexdigest()}
                  for name in given] if self.options.from_records else []  # fmt: skip
        source = f"--records {' '.join(given)}" if self.options.from_records else f"--store {' '.join(given)}"
        extra = shlex.join(self.options.argv() + [f"--set={m}.{k}={v}" for m, values in sorted(self.options.overrides.items())
                                                  for k, v in sorted(values.items())])  # fmt: skip
        protocol = f" --protocol {self.options.protocol}" if self.options.protocol else ""
        return {
            "machines": count(f"{r.get('device', '?')} · {r.get('device_name', '?')}" for r in records),
            "versions": {name: sorted(c.items()) for name, c in versions.items()},
            "commits": count(r.get("git_commit", "unknown") for r in records),
            "execution": count(r.get("execution", "per-client") for r in records),
            "inputs": inputs,
            "command": f"{STAMP_ENV}=<stamp> gflbench report {source}{protocol}{(' ' + extra) if extra else ''} --out SITE".replace(
                "  ", " "
            ),
            "alpha": self.options.test.alpha,
            "test": self.options.test.name,
        }

    def write(self, context: Mapping[str, Any]) -> list[Path]:
        env = jinja2.Environment(
            loader=jinja2.PackageLoader("gfl_bench.report", "templates"),
            autoescape=jinja2.select_autoescape(["html", "j2"]),
            undefined=jinja2.StrictUndefined,  # a misspelt field is an error, not a silently empty cell
            trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
        )  # fmt: skip
        index = self.out / "index.html"
        index.write_text(env.get_template("index.html.j2").render(**context), encoding="utf-8")
        written = [index, *self.figures]
        templates = resources.files("gfl_bench.report").joinpath("templates")
        for name in STATIC:
            target = self.out / ASSETS / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(templates.joinpath(name).read_bytes())
            written.append(target)
        return written


def grid_cost_csv() -> Path:
    """bench/grid_cost.csv of the checkout: every method's seconds per round on every paper dataset (bench/grid_cost.py)."""
    return Path(__file__).resolve().parent.parent.parent / "bench" / GRID_COST_CSV


def whole_grid_cost(parts: Mapping[str, Mapping[str, RunSpec]], every: Mapping[str, RunSpec]) -> dict[str, Any]:
    """What every run of the paper grid costs on one CPU worker, from bench/grid_cost.csv: a run's seconds are its
    rounds × its method's seconds per round on its dataset at METIS 10 clients × that method's ratio, on Cora,
    of the run's setting to METIS 10 (1 where Cora lacks either round, said). A method not timed on a dataset is
    FedAvg's time there times the method's Cora time over FedAvg's (said apart). Per part of the grid: the hours,
    the hours resting on generated stand-ins or on that scaling, and the runs whose basis is a bound or one round."""
    path = grid_cost_csv()
    if not path.is_file():
        return {"rows": [], "matrix": None, "path": GRID_COST_PATH, "machine": ""}
    table = pd.read_csv(path)
    rows_of = {(r.method, r.dataset, r.scheme, int(r.clients)): r for r in table.itertuples(index=False)}
    no_ratio: set[tuple[str, str, int]] = set()

    def per_run(spec: RunSpec) -> tuple[float, str, bool, bool] | None:
        row, scale, scaled = rows_of.get((spec.method, spec.dataset, *GRID_COST_BASE)), 1.0, False
        if row is None:  # FedAvg's row on the dataset, times the method's Cora round over FedAvg's
            row = rows_of.get((GRID_COST_REFERENCE, spec.dataset, *GRID_COST_BASE))
            own, reference = (
                rows_of.get((m, GRID_COST_RATIO_DATASET, *GRID_COST_BASE)) for m in (spec.method, GRID_COST_REFERENCE)
            )
            if row is None or own is None or reference is None:
                return None
            scale, scaled = own.seconds_per_round / reference.seconds_per_round, True
            status = own.status if own.status != "measured" else row.status
        else:
            status = row.status
        ratio = 1.0
        if (spec.scheme, spec.clients) != GRID_COST_BASE:
            at, base = (
                rows_of.get((spec.method, GRID_COST_RATIO_DATASET, *k))
                for k in ((spec.scheme, spec.clients), GRID_COST_BASE)
            )
            if at is not None and base is not None and at.status == base.status == "measured":
                ratio = at.seconds_per_round / base.seconds_per_round
            else:
                no_ratio.add((spec.method, spec.scheme, spec.clients))
        return (
            row.seconds_per_round * scale * ratio * spec.rounds,
            status,
            str(row.graph).startswith("stand-in"),
            scaled,
        )

    rows = []
    for name, specs in [*parts.items(), ("All (each run once)", every)]:
        costs = [c for c in map(per_run, specs.values()) if c is not None]
        rows.append({
            "name": name, "runs": len(specs), "with_basis": len(costs),
            "hours": f"{sum(c[0] for c in costs) / 3600:,.1f}",
            "stand_in_hours": f"{sum(c[0] for c in costs if c[2]) / 3600:,.1f}",
            "scaled_hours": f"{sum(c[0] for c in costs if c[3]) / 3600:,.1f}",
            "bounded": sum(c[1] in ("lower bound", "warm-up only") for c in costs),
            "single": sum(c[1] == "1 round" for c in costs),
        })  # fmt: skip
    datasets = [d for d in tables.HOMOPHILIC + tables.HETEROPHILIC if (table["dataset"] == d).any()]
    methods = tables.method_order([m for m in table["method"].unique() if m in all_methods()])
    marks = {"measured": "", "1 round": "¹", "warm-up only": "ʷ", "lower bound": "≥"}
    matrix = []
    for method in methods:
        entries = []
        for dataset in datasets:
            row = rows_of.get((method, dataset, *GRID_COST_BASE))
            if row is None:
                entries.append({"text": "", "classes": ""})
                continue
            text = f"{row.seconds_per_round:.2f}"
            entries.append({"text": ("≥" + text) if row.status == "lower bound" else text + marks[row.status].replace("≥", ""),
                            "classes": " ".join(c for c in ("stand-in" if str(row.graph).startswith("stand-in") else "",
                                                              "bound" if row.status != "measured" else "") if c)})  # fmt: skip
        matrix.append({"method": all_methods()[method].title, "cells": entries})
    graphs = [
        {"dataset": dataset_spec(d).title, "graph": table.loc[table["dataset"] == d, "graph"].iloc[0]} for d in datasets
    ]
    return {"rows": rows, "path": GRID_COST_PATH, "machine": "; ".join(sorted(set(table["machine"].astype(str)))),
            "datasets": [dataset_spec(d).title for d in datasets], "matrix": matrix, "graphs": graphs,
            "no_ratio": ", ".join(f"{m} {s}-{c}" for m, s, c in sorted(no_ratio)) or "none",
            "ratio_dataset": dataset_spec(GRID_COST_RATIO_DATASET).title}  # fmt: skip


def _reading(rule: str, metric: str, clients: int) -> dict[str, str]:
    """How a cell's number was read from its runs (docs/protocol.md, "Evaluation and selection")."""
    model = "each client's own model right after its local training in that round (for FedAvg the global model plus local epochs)"
    clients_text = (f"all {clients} clients' local test nodes, plain mean over clients (a client without test nodes, or "
                    f"with one class for ROC-AUC, is left out and counted in the record's excluded_clients)")  # fmt: skip
    if rule == "global":
        long = (f"Client-mean test {metric} at the run's best client-mean validation round (the first round with the "
                f"highest mean validation {metric}); model: {model}; clients: {clients_text}. Then mean ± population "
                "std (ddof 0) over the seeds.")  # fmt: skip
        short = "client-mean test at the best client-mean validation round, after local training, all clients"
    else:
        long = (
            f"Each client's test {metric} at its own best validation round, then the plain mean over clients "
            f"(per-client selection); model: {model}; clients: {clients_text}. Then mean ± population std over the seeds."
        )
        short = "each client at its own best validation round, after local training, all clients"
    return {"long": long, "short": short}


def _preset_rows(cls: type, dataset: str, scheme: str, clients: int) -> dict[str, PresetRow]:
    """The preset file's row behind each value `Method.paper_preset` gives this setting (the row that names the
    setting most closely, as gfl_bench/presets.py chooses it)."""
    if cls.paper_preset_file is None:
        return {}
    given = cls.paper_preset(dataset, scheme, clients)
    matching = [row for row in read_preset(cls, cls.paper_preset_file) if row.matches(dataset, scheme, clients)]
    return {key: max((r for r in matching if r.key == key), key=lambda r: r.rank) for key in given}


def _preset_source(cls: type, row: PresetRow) -> str:
    where = ",".join("*" if v is None else str(v) for v in (row.dataset, row.scheme, row.clients))
    return f"gfl_bench/presets/{cls.paper_preset_file}, row {where},{row.key}: {row.source}"


def _plain_table(frame: pd.DataFrame) -> str:
    """A text frame as an HTML table (pandas escapes the text)."""
    flat = frame.copy()
    flat.columns = [" ".join(p for p in col if p) for col in frame.columns]
    return flat.to_html(classes="plain", border=0, escape=True)


_FIGURE_STYLE = {"font.size": 8, "axes.titlesize": 9, "legend.fontsize": 7}


def _cost_figure(points: list[dict], setting: tuple[str, str, int], out: Path) -> list[Path]:
    """Accuracy against megabytes communicated and against training seconds, one labelled point per method."""
    with plt.rc_context(_FIGURE_STYLE):
        fig, axes = plt.subplots(1, 2, figsize=(8, 3))
        for ax, key, label in (
            (axes[0], "mb", "MB communicated (all rounds)"),
            (axes[1], "seconds", "training seconds (all rounds)"),
        ):
            same: dict[tuple[float, float], list[str]] = {}  # methods at one point (FedProx = FedAvg) share a label
            for p in points:
                same.setdefault((round(p[key], 6), round(p["value"], 6)), []).append(p["method"])
            for (x, y), names in same.items():
                ax.scatter(x, y, s=18)
                ax.annotate(" = ".join(names), (x, y), textcoords="offset points", xytext=(4, 2), fontsize=7)
            ax.set_xlabel(label)
            ax.set_ylabel(f"test {_metric(setting[0])} (%)")
            ax.grid(alpha=0.3)
        fig.tight_layout()
        return plots.save_figure(fig, out, (".svg",))


def _client_figure(boxes: Mapping[str, np.ndarray], setting: tuple[str, str, int], out: Path) -> list[Path]:
    """Box plots of the clients' test values per method."""
    with plt.rc_context(_FIGURE_STYLE):
        fig, ax = plt.subplots(figsize=(max(4.0, 0.7 * len(boxes) + 1.5), 3))
        ax.boxplot([v[np.isfinite(v)] for v in boxes.values()], showmeans=True)
        ax.set_xticks(range(1, len(boxes) + 1), list(boxes), rotation=30, ha="right")
        ax.set_ylabel(f"client test {_metric(setting[0])} (%)")
        ax.grid(alpha=0.3, axis="y")
        fig.tight_layout()
        return plots.save_figure(fig, out, (".svg",))
