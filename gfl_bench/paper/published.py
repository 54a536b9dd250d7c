"""The paper's published numbers (Tables 1, 2, 4, 5, 6, 7), transcribed once into paper_results.csv.

Columns: table, method (CLI name; `average` is Table 7's Average row), dataset (CLI name; `avg` for
the Avg. columns), scheme (metis / overlap), clients (a count, or `all` for Avg. All), mean, std
(percent; seconds per round in Table 7, which has no std). Ablation rows are the registered
variant names (`fedgmc-wo-semantic`, ...). `paper_source` says where each published cell comes from.
"""

from __future__ import annotations

import functools
from importlib import resources

import pandas as pd


@functools.cache
def paper_results() -> pd.DataFrame:
    with resources.files("gflbench.paper").joinpath("paper_results.csv").open() as handle:
        return pd.read_csv(handle, dtype={"clients": str})


# Where the paper's cells come from (docs/protocol.md, "Where the paper's numbers come from"). Most
# baseline cells are inherited from earlier papers, not re-run: a user comparing against one must run
# that cell's source setup, which is what the `paper` protocol configures.
_FEDPUB_TABLE1 = ("local", "fedavg", "fedprox", "fedper", "gcfl", "fedgnn", "fedsage+")
SOURCES = {
    "fedpub-table1": "FED-PUB (ICML 2023) Table 1: 2-layer GCN, mean of 3 runs (checked cell by cell via FedAux)",
    "fedpub-own": "FED-PUB (ICML 2023) Table 1, its own row (masked GCN, 3 runs; not checked cell by cell)",
    "fediih-appendix": "FedIIH (AAAI 2025) appendix (20 Table 1 cells checked)",
    "fediih-time": "FedIIH (AAAI 2025) appendix, measured on other hardware",
    "fedgmc": "the FedGMC paper's own run",
    "untraced": "inherited, source not traced (most likely FedIIH/FedICI/FedSSA, which follow FED-PUB's setup)",
}


def paper_source(table: int, method: str) -> str:
    """Which key of SOURCES a published cell comes from."""
    if method == "fedgmc" or method.startswith("fedgmc-"):
        return "fedgmc"
    if table == 7:
        return {"fedpub": "fediih-time", "fediih": "fediih-time", "fedavg": "fedgmc"}.get(method, "untraced")
    if table == 1 and method in _FEDPUB_TABLE1:
        return "fedpub-table1"
    if table == 1 and method == "fedpub":
        return "fedpub-own"
    if table == 1 and method == "fediih":
        return "fediih-appendix"
    return "untraced"
