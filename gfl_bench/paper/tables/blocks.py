"""What a table is made of: a cell's numbers (`Cell`), its execution band (`Band`), and the rectangular
pieces (`Block`) that the layouts build and the renderers write."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from gflbench.paper.significance import PairedTest


@dataclass(frozen=True)
class Cell:
    mean: float  # percent (seconds for Table 7)
    std: float
    n: int  # finished runs
    failed: int  # failed runs
    note: str = ""  # shown instead of a number where the cell has runs but no value to show (n = 0, not failed)


@dataclass(frozen=True)
class Band:
    """A cell's execution band (docs/protocol.md, "Execution band"): how far one seed's value moves across
    the executions the store holds of it (executor, feature layout, stacking, device: gfl_bench/core/execution.py;
    execution switches such as FedIIH's routing kernel: gfl_bench/core/switches.py)."""

    spread: float  # the largest, over the cell's seeds, of max − min of one seed's values across executions
    seeds: int  # seeds stored under more than one execution
    executions: tuple[str, ...]  # the executions seen, each as its execution key and switch values

    def exceeds(self, cell: Cell | None) -> bool:
        """Whether the band is wider than the cell's seed std: then execution, not the seed, moves the cell most."""
        return cell is not None and cell.n > 0 and self.spread > cell.std


@dataclass(frozen=True)
class Block:
    """One rectangular piece of a table: text cells, the numbers behind them, and how to rank them."""

    text: pd.DataFrame  # rows: method titles; columns: (group, sub-column)
    values: pd.DataFrame  # same shape; NaN where there is no number
    higher_is_better: bool | None = True  # None: no bold/underline
    marks: pd.DataFrame | None = None  # same shape: a significance.Mark where a column was tested, else None
    test: PairedTest | None = None  # the test behind `marks`
    bands: pd.DataFrame | None = None  # same shape: a Band where a cell has one, else None
    verbatim: bool = False  # Markdown prints the text as written (tabulate would read "+0.020" as the number 0.02)


def frame_of(rows: Mapping[str, list], columns: list[tuple[str, str]]) -> pd.DataFrame:
    """A block's frame: one row per label (the index, named "Methods"), columns `(group, sub-column)`."""
    frame = pd.DataFrame.from_dict(dict(rows), orient="index", columns=pd.MultiIndex.from_tuples(columns))
    frame.index.name = "Methods"
    return frame


def top_entries(block: Block) -> pd.DataFrame:
    """True where an entry is its column's best or not significantly worse than it."""
    assert block.marks is not None
    return block.marks.map(lambda mark: mark is not None and mark.top)
