"""Writing the site: the records read as the tables read them, the output folder checked, every page and
section rendered through the template into a staging folder, and moved into place only once all of it was
written; the marker lists the files, so that a rebuild replaces exactly them."""

from __future__ import annotations

import datetime
import json
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
import matplotlib.pyplot as plt

from gflbench.errors import UserError
from gflbench.experiments.protocol import DEFAULT_PROTOCOL, PROTOCOLS
from gflbench.experiments.spec import HARNESS_VERSION
from gflbench.experiments.store import RunStore, disagreements, read_records
from gflbench.paper.published import SOURCES
from gflbench.report.grid import grid_cost
from gflbench.report.options import STAMP_ENV, Options, stamp
from gflbench.report.overview import other_configurations, partitions, reproducibility
from gflbench.report.pages import protocol_page
from gflbench.report.site import ASSETS, Site

MARKER = ".gflbench-report.json"  # in every report folder: what was written, so a rebuild may replace it
STATIC = ("style.css", "report.js")  # copied from the templates as they are
# The sections the issue asks for that this report does not build yet (docs/report.md says why).
NOT_BUILT = (
    (
        "The grid's cost on a GPU (no GPU has measured bench/grid_cost.py's cells; no factor is assumed)",
        "GFLBENCH_RAW_MIRROR=... python bench/grid_cost.py --device cuda --out bench/grid_cost.csv",
    ),
)


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


def build(
    runs: RunStore, out: Path, options: Options, force: bool = False, say: Callable[[str], None] = lambda _: None
) -> list[Path]:
    """Write the site for every stored run into `out`; returns the files written. `say` hears each partition
    whose statistics could not be remade here, so a site built without the data does not pass unnoticed."""
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
        files = _render(Site(staged, runs, frame, options), protocols, when, len(frame), say)
        for name in previous:  # a previous report's files: this build writes its own set
            path = out / name
            if path.is_file() and path.resolve().is_relative_to(out.resolve()):
                path.unlink()
        for path in files:  # only after the whole site was rendered: a failed build leaves `out` as it was
            target = out / path.relative_to(staged)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
    return [out / path.relative_to(staged) for path in files]


def _render(
    staging: Site, protocols: Sequence[str], when: datetime.datetime, runs: int, say: Callable[[str], None]
) -> list[Path]:
    """Every file of the site, written under the staging folder; the marker last."""
    pages = [protocol_page(staging, p) for p in protocols]
    shown = {key for page in pages for key in page["run_keys"]}
    if not shown:
        other = other_configurations(staging, shown)
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
        "other": other_configurations(staging, shown),
        "reproducibility": reproducibility(staging, shown),
        "grid": grid_cost(staging),
        "partitions": partitions(staging, shown, say),
        "not_built": NOT_BUILT,
        "sources": SOURCES,
        "harness": HARNESS_VERSION,
    }
    written = _write(staging, context)
    marker = staging.out / MARKER
    marker.write_text(json.dumps({"files": sorted(p.relative_to(staging.out).as_posix() for p in written),
                                  "stamp_epoch": context["stamp_epoch"]}, indent=1) + "\n")  # fmt: skip
    return [*written, marker]


def _write(site: Site, context: Mapping[str, Any]) -> list[Path]:
    """The page from the template, then the static assets beside the figures; the files written."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("gflbench.report", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        undefined=jinja2.StrictUndefined,  # a misspelt field is an error, not a silently empty cell
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
    )  # fmt: skip
    index = site.out / "index.html"
    index.write_text(env.get_template("index.html.j2").render(**context), encoding="utf-8")
    written = [index, *site.figures]
    templates = resources.files("gflbench.report").joinpath("templates")
    for name in STATIC:
        target = site.out / ASSETS / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(templates.joinpath(name).read_bytes())
        written.append(target)
    return written
