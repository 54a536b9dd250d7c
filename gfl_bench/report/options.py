"""What `gflbench report` is asked for: the options that select the cells (as `gflbench table` selects them),
the protocol, and the build stamp, each checked before any work."""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gflbench.errors import UserError
from gflbench.experiments.protocol import PROTOCOLS
from gflbench.paper.significance import PairedTest

STAMP_ENV = "SOURCE_DATE_EPOCH"  # seconds since 1970 (UTC); pins the build stamp (reproducible-builds.org)


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
