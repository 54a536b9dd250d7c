"""Blocks written out: as terminal tables (`terminal.FoldedTables`), Markdown, LaTeX (best value bold, second
underlined) or CSV, with the legend of the significance marks and execution bands they carry."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

import pandas as pd

from gflbench.errors import UserError
from gflbench.paper.significance import FEW
from gflbench.paper.tables.blocks import Block, top_entries
from gflbench.paper.tables.terminal import FoldedTables

FORMATS = ("terminal", "markdown", "latex", "csv")


def render(blocks: Sequence[Block], caption: str, fmt: str):
    """Blocks in one format: a string (markdown, latex, csv) or a rich renderable (terminal), which folds
    itself to the width of the console it is printed on (`FoldedTables`).

    Where the blocks carry significance marks, the caption gains what marks them in this format
    and the test behind them.
    """
    test = next((b.test for b in blocks if b.marks is not None and b.test is not None), None)
    if test is not None:
        caption = f"{caption.rstrip('.')}. {MARK_LEGENDS[fmt]}: {test.describe()}."
    if any(b.bands is not None for b in blocks):
        caption = f"{caption.rstrip('.')}. {BAND_LEGEND}."
    if fmt == "terminal":
        return FoldedTables(tuple(blocks), caption)
    writer = {"markdown": _markdown, "latex": _latex, "csv": _csv}[fmt]
    return "\n".join(writer(b, caption if i == 0 else f"{caption} (continued)") for i, b in enumerate(blocks))


_TOP = "the best mean of each dataset column and every method not significantly worse than it"
MARK_LEGENDS = {
    "terminal": f"†: {_TOP} (also bold on a terminal)",
    "markdown": f"Bold: {_TOP}",
    "latex": f"Bold: {_TOP}",
    "csv": "Columns '<column> top' (best; ns: not significantly worse than the best; worse; n<k: not tested) "
    "and '<column> p' (adjusted p against the best)",
}


BAND_LEGEND = (
    "exec X: the execution band, the largest spread (max − min) of one seed's value across the executions the "
    "store holds of it (per-client or batched, dense or sparse features, stacked seeds, device, kernel switches); "
    "'> std' where it is wider than the seed std (docs/protocol.md, \"Execution band\")"
)


def _flat(frame: pd.DataFrame) -> pd.DataFrame:
    flat = frame.copy()
    flat.columns = [" ".join(p for p in col if p) for col in frame.columns]
    return flat


def _markdown(block: Block, caption: str) -> str:
    text = block.text if block.marks is None else block.text.mask(top_entries(block), "**" + block.text + "**")
    flat = _flat(text)
    aligned = {"disable_numparse": True, "colalign": ["left"] + ["right"] * len(flat.columns)} if block.verbatim else {}
    return f"**{caption}**\n\n{flat.to_markdown(**aligned)}\n"


def _csv(block: Block, caption: str) -> str:
    """The text columns, then per tested column its verdicts and adjusted p-values (for scripts)."""
    flat = _flat(block.text)
    if block.marks is not None:
        marks = _flat(block.marks)
        for column in marks.columns[marks.notna().any()]:
            flat[f"{column} top"] = marks[column].map(
                lambda m: "" if m is None else f"n<{block.test.min_seeds}" if m.verdict == FEW else m.verdict
            )
            flat[f"{column} p"] = marks[column].map(lambda m: "" if m is None or math.isnan(m.p) else f"{m.p:.4g}")
    if block.bands is not None:
        bands = _flat(block.bands)
        for column in bands.columns[bands.notna().any()]:
            flat[f"{column} exec"] = bands[column].map(lambda b: "" if b is None else f"{b.spread:.4g}")
    buffer = io.StringIO()
    flat.to_csv(buffer, lineterminator="\n")
    return f"# {caption}\n{buffer.getvalue()}"


def _latex(block: Block, caption: str) -> str:
    """Bold marks the significance group where a block was tested; else the best bold, the second underlined."""
    marked = block.text.copy()
    if block.marks is not None:
        marked = marked.mask(top_entries(block), marked.map(lambda s: rf"\textbf{{{s}}}"))
    elif block.higher_is_better is not None:
        for column in block.text.columns:
            ranked = block.values[column].drop(index="Average", errors="ignore").dropna()
            ranked = ranked.sort_values(ascending=not block.higher_is_better)
            for rank, style in enumerate((r"\textbf{%s}", r"\underline{%s}")):
                if len(ranked) > rank:
                    marked.loc[ranked.index[rank], column] = style % marked.loc[ranked.index[rank], column]
    symbols = {"±": r"$\pm$", "↓": r"$\downarrow$", "↑": r"$\uparrow$", "<": "$<$"}
    marked = marked.map(lambda s: "".join(symbols.get(ch, ch) for ch in s))
    body = marked.to_latex(multicolumn=True, multicolumn_format="c", escape=False)
    return f"% {caption}\n{body}"


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise UserError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
