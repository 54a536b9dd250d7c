"""One report being built: the stored runs it reads (each record read once), each protocol's selection and
cells, and the figures written so far. The sections are functions of a `Site` (boards, provenance, views,
overview, grid); this holds only what they share."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import pandas as pd

from gflbench.core.method import all_methods
from gflbench.experiments.store import RunStore
from gflbench.paper import tables
from gflbench.report.options import Options

ASSETS = "assets"  # the site's folder of style sheet, script and figures


class Site:
    """The selections per protocol, the figures written so far, the records read so far."""

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

    def figure(self, draw: Callable[[Path], list[Path]], stem: str) -> str | None:
        """Draw a figure as SVG under assets/; its path relative to the site, or None when nothing was drawn."""
        written = draw(self.out / ASSETS / stem)
        if not written:
            return None
        self.figures.extend(written)
        return f"{ASSETS}/{stem}.svg"
