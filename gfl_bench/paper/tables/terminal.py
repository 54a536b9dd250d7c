"""Blocks as terminal tables folded to the console's width (`FoldedTables`), never a value cut."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gflbench.paper.tables.blocks import Block, top_entries

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult
    from rich.measure import Measurement

# What a rich table adds to its columns' widths: one space of padding on each side of a cell and one border
# per column, plus the closing border.
_COLUMN_FRAME = 3
_TABLE_FRAME = 1


@dataclass(frozen=True)
class FoldedTables:
    """Blocks as terminal tables that never cut a value: a rich renderable folded to the console's width.

    rich fits a wide table into a narrow console by squeezing every column and cutting what no longer fits
    (`80.29±0.…`). Here a block whose columns do not fit side by side is folded instead: its data columns
    are split, in order, into groups that fit, each group a table of its own with the row labels repeated.
    A data column keeps the width of its widest cell, so a mean±std with its marks stays on one line;
    only where one column alone does not fit (a console of some 20 columns) does a cell wrap at its spaces,
    and never inside a number. Headers and row labels wrap, and fold a word longer than their column, but
    are never cut to `…`. Off a terminal the console is wide (cli `_plain`), so every block is one table.
    The caption is printed above the first table at the console's width, not as a table title, which
    rich would wrap at the table's width even in a piped line.
    """

    blocks: tuple[Block, ...]
    caption: str

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        from rich.text import Text

        yield Text(self.caption, no_wrap=False, overflow="fold")
        for block in self.blocks:
            yield from self._tables(block, console, options)

    @staticmethod
    def _tables(block: Block, console: Console, options: ConsoleOptions) -> RenderResult:
        from rich.measure import Measurement
        from rich.table import Table
        from rich.text import Text

        top = top_entries(block) if block.marks is not None else block.text.map(lambda _: False)
        labels = [Text(str(name)) for name in block.text.index]  # Text: `[gcn]` is not rich markup
        headers = [Text(f"{group}\n{sub}" if group else sub) for group, sub in block.text.columns]
        cells = [[Text(f"{v} †", style="bold") if m else Text(str(v)) for v, m in zip(block.text[c], top[c])]
                 for c in block.text.columns]  # fmt: skip

        def measure(texts: list[Text]) -> Measurement:  # (longest word, longest line) over a column's texts
            sizes = [Measurement.get(console, options, t) for t in texts]
            return Measurement(max(m.minimum for m in sizes), max(m.maximum for m in sizes))

        label = measure([*labels, Text(block.text.index.name or "")])
        full = [max(measure(column).maximum, measure([header]).maximum) for column, header in zip(cells, headers)]
        least = [measure(column).minimum for column in cells]  # a number is one word: never narrower than it
        for group, label_width, widths in _fold(options.max_width, label, full, least):
            t = Table()
            t.add_column(block.text.index.name or "", width=label_width, overflow="fold")
            for j, width in zip(group, widths):
                t.add_column(headers[j], justify="right", width=width, overflow="fold")
            for i, name in enumerate(labels):
                t.add_row(name, *(cells[j][i] for j in group))
            yield t


def _fold(
    width: int, label: Measurement, full: Sequence[int], least: Sequence[int]
) -> list[tuple[list[int], int, list[int]]]:
    """Groups of data columns (indices), each with the width of its label column and of its data columns,
    such that each group's table fits in `width` console columns.

    `label` is the label column's (longest word, longest line); `full[j]` the width column j needs for
    its widest cell and header line, `least[j]` for its longest word. All columns side by side at full
    width where they fit (the unfolded table); otherwise columns are taken in order while they fit at
    full width next to labels as wide as their longest word, and the room left goes to the labels. A
    column that does not fit alone at full width shares the room with the labels, half each where it
    needs that much, but never narrower than its longest word (a number); the labels get what remains
    (at least one character, folded).
    """
    frame = _TABLE_FRAME + _COLUMN_FRAME  # the label column's frame and the closing border
    if frame + label.maximum + sum(w + _COLUMN_FRAME for w in full) <= width:
        return [(list(range(len(full))), label.maximum, list(full))]
    label_width = label.minimum
    room = width - frame - label_width
    groups: list[list[int]] = []
    for j, w in enumerate(full):
        if groups and sum(full[k] + _COLUMN_FRAME for k in groups[-1]) + w + _COLUMN_FRAME <= room:
            groups[-1].append(j)
        else:
            groups.append([j])
    folded = []
    for group in groups:
        used = sum(full[k] + _COLUMN_FRAME for k in group)
        if used <= room:  # fits at full width: the labels take what is left, up to their longest line
            folded.append((group, min(label.maximum, width - frame - used), [full[k] for k in group]))
            continue
        (j,) = group  # one column wider than the room beside the labels: it and they share what there is
        shared = width - frame - _COLUMN_FRAME
        column = max(least[j], 1, min(full[j], shared - min(label_width, shared // 2)))
        folded.append((group, max(1, shared - column), [column]))
    return folded
