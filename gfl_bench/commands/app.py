"""The `gflbench` command line: wires the commands of gfl_bench/commands/ into one `gflbench`, and sets up what
must precede them (a stream encoding that cannot fail, the help's width, one-line usage errors, SIGTERM).

Every command validates its whole input before doing any work: a bad name or count prints one
line on stderr and exits with 2, and nothing is stored. A grid stores each run the moment it
finishes, so Ctrl-C or a crash loses at most the run in progress; rerunning skips stored runs.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import signal
import sys
import unicodedata
import warnings
from collections.abc import Iterator
from typing import Annotated, Any

# What a non-UTF-8 stdout (PYTHONIOENCODING=latin-1, a C locale) gets instead of a character it cannot encode;
# box-drawing lines become - | +, anything else unlisted its unaccented letter or ?.
_ASCII = {"±": "+-", "†": "+", "↓": "v", "↑": "^", "≡": "==", "⚑": "!", "×": "x", "α": "alpha", "χ": "chi",
          "²": "2", "—": "-", "–": "-", "·": ".", "∈": " in ", "…": "..."}  # fmt: skip


def _ascii_spelling(error: UnicodeError) -> tuple[str, int]:
    """Codec error handler: ASCII spellings for what the stream's encoding lacks, so that a table or a
    list still prints whole (rich draws its own borders in ASCII there) instead of failing."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    spelled = []
    for char in error.object[error.start : error.end]:
        name = unicodedata.name(char, "")
        if char in _ASCII:
            spelled.append(_ASCII[char])
        elif name.startswith("BOX DRAWINGS"):
            spelled.append(
                "+" if ("VERTICAL" in name) == ("HORIZONTAL" in name) else "|" if "VERTICAL" in name else "-"
            )
        else:
            spelled.append(unicodedata.normalize("NFKD", char).encode("ascii", "ignore").decode() or "?")
    return "".join(spelled), error.end


codecs.register_error("gflbench-ascii", _ascii_spelling)
for _stream in (sys.stdout, sys.stderr):
    if hasattr(_stream, "reconfigure") and not codecs.lookup(_stream.encoding or "ascii").name.startswith("utf"):
        _stream.reconfigure(errors="gflbench-ascii")

if not sys.stdout.isatty():  # piped help is never cut to 80 columns (typer reads this when it formats help)
    os.environ.setdefault("TERMINAL_WIDTH", "200")

import typer

from gflbench.commands import figures, listing, reading, running, storage, tuning
from gflbench.commands.common import _terminated, err_console
from gflbench.data import VERBOSE_ENV

try:  # typer 0.2x parses with its own copy of click, earlier versions with click itself
    from typer._click.exceptions import UsageError
except ImportError:
    from click.exceptions import UsageError


class OneLineUsageErrors(typer.core.TyperGroup):
    """The `gflbench` group: a command line click cannot parse (`--seeds ten`, an unknown option or command, a
    missing one) is one line on stderr and exit 2, like every other bad input, instead of typer's five-line box.

    Parsing happens in the group's `make_context` (its own options) and `invoke` (the command's name, then the
    command's options), so both turn click's `UsageError` into the line and `typer.Exit(2)`, which typer ends
    as it ends any exit. A bare `gflbench` or `gflbench plot` still shows its help (NoArgsIsHelpError).
    """

    def make_context(self, info_name: str | None, args: list[str], parent: typer.Context | None = None,
                     **extra: Any) -> typer.Context:  # fmt: skip
        with _usage_errors_in_one_line():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: typer.Context) -> Any:
        with _usage_errors_in_one_line():
            return super().invoke(ctx)


@contextlib.contextmanager
def _usage_errors_in_one_line() -> Iterator[None]:
    """`error: <click's message>; see `<command> --help``, exit 2, for a command line that does not parse."""
    try:
        yield
    except UsageError as error:
        if type(error).__name__ == "NoArgsIsHelpError":  # click >= 8.2's way to show the help: let typer show it
            raise
        message = " ".join(error.format_message().split()).rstrip(".")
        where = f"; see `{error.ctx.command_path} --help`" if error.ctx is not None else ""
        err_console.print(f"error: {message[:1].lower()}{message[1:]}{where}", markup=False, highlight=False,
                          soft_wrap=True)  # fmt: skip
        raise typer.Exit(2) from None


app = typer.Typer(
    cls=OneLineUsageErrors,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="gflbench: subgraph federated learning benchmark (FedGMC and baselines).",
)


@app.callback()
def main(
    verbose: Annotated[bool, typer.Option("--verbose", help="Show library output (PyG processing, warnings).")] = False,
) -> None:
    """gflbench: subgraph federated learning benchmark (FedGMC and baselines)."""
    if verbose:
        os.environ[VERBOSE_ENV] = "1"  # worker processes inherit it
    else:
        warnings.filterwarnings("ignore")
    signal.signal(signal.SIGTERM, _terminated)  # a batch system's stop closes like Ctrl-C, not mid-statement


plot_app = typer.Typer(no_args_is_help=True, help="The paper's figures from stored runs (PNG and PDF).")
app.command()(running.run)
app.command()(running.sweep)
app.command()(running.failed)
app.command()(storage.export)
app.command("import")(storage.import_runs)
app.command()(reading.table)
app.command()(listing.datasets)
app.command()(reading.compare)
app.command()(reading.report)
app.command()(tuning.tune)
app.add_typer(plot_app, name="plot")
plot_app.command("convergence")(figures.plot_convergence)
plot_app.command("sensitivity")(figures.plot_sensitivity)
plot_app.command("case-study")(figures.plot_case_study)
plot_app.command("ranks")(figures.plot_ranks)
app.command()(listing.partitions)
app.command()(listing.methods)


if __name__ == "__main__":
    app()
