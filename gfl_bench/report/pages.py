"""One protocol's page: its tables, each shown cell's provenance, and the views over its cells, gathered for
the template."""

from __future__ import annotations

from typing import Any

from gflbench.experiments.protocol import PROTOCOLS
from gflbench.paper import tables
from gflbench.paper.compare import compare
from gflbench.report.boards import ablations, board, table_numbers
from gflbench.report.provenance import provenance
from gflbench.report.site import Site
from gflbench.report.text import slug
from gflbench.report.views import client_view, convergence, cost, sensitivity


def protocol_page(site: Site, protocol: str) -> dict[str, Any]:
    """Everything the template shows of one protocol; `run_keys`: the runs its cells rest on."""
    sel = site.selection(protocol)
    stored = site.frame[site.frame["protocol"] == protocol]
    methods = tables.method_order([m for m in stored["method"].unique() if m in site.registered])
    rows = [m for m in methods if m not in tables.ABLATIONS]
    cells = site.cells(sel, methods)
    paper = compare(sel, rows, tables=(1, 2, 4, 5)).cells
    paper_index = {
        (int(r.table), r.method, r.dataset, r.scheme, int(r.clients)): r for r in paper.itertuples(index=False)
    }
    by_cell = {cell: provenance(site, sel, *cell) for cell in cells}
    boards = [board(site, sel, n, rows, by_cell, paper_index) for n in table_numbers(stored)]
    boards = [b for b in boards if b is not None]
    table6 = ablations(site, sel, stored)
    settings = sorted({(d, s, c) for _, d, s, c in cells})
    return {
        "name": protocol,
        "id": slug(protocol),
        "description": PROTOCOLS[protocol],
        "hyperparameters": tables.hyperparameter_source(protocol, site.options.tuned),
        "boards": boards,
        "ablations": table6,
        "provenance": [by_cell[c] for c in cells],
        "cost": cost(site, sel, protocol, cells, settings),
        "clients": client_view(site, sel, protocol, cells, settings),
        "convergence": convergence(site, sel, protocol, methods, settings),
        "sensitivity": sensitivity(site, sel, protocol, stored),
        "run_keys": sorted({k for p in by_cell.values() for k in p["run_keys"]}),
    }
