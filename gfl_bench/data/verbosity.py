"""What `gflbench --verbose` shows: library output, and one line for each routine repair (a cache rebuilt, a
copy renewed) that is otherwise quiet."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import warnings
from collections.abc import Iterator

VERBOSE_ENV = "GFLBENCH_VERBOSE"  # set by `gflbench --verbose`; worker processes inherit it


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """Hide PyG's "Processing... Done!" and library warnings unless the user asked for --verbose.

    Errors still surface: they are exceptions, not prints.
    """
    if os.environ.get(VERBOSE_ENV):
        yield
        return
    with (
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        yield


def say_verbose(message: str) -> None:
    """One line on stderr under `gflbench --verbose`: a cache rebuilt or a copy renewed is routine repair,
    quiet otherwise, but a user who asks can see that it happened and why."""
    if os.environ.get(VERBOSE_ENV):
        print(message, file=sys.stderr, flush=True)
