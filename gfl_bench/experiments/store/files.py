"""Records to and from JSON Lines files (`gflbench export`, `import`, and the spool of runs a store could not
take): written whole or not at all, never through a link or over a device, and every record read checked before
any is stored."""

from __future__ import annotations

import contextlib
import glob
import gzip
import json
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gflbench.errors import UserError
from gflbench.experiments.store.checks import check_record
from gflbench.experiments.store.rows import _json
from gflbench.experiments.upgrades import upgrade_record


def _check_target(path: Path) -> None:
    """Refuse an export or spool target that is not a regular file (or a new name in a folder): renaming
    over it would replace a device node, FIFO or symlink with a file (as root, /dev/full became one)."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    except NotADirectoryError:
        parent = next(p for p in path.parents if p.exists())
        raise UserError(f"cannot write {path}: {parent} is a file, not a folder") from None
    except OSError as error:
        raise UserError(f"cannot write {path}: {error}") from None
    if not stat.S_ISREG(mode):
        kinds = {stat.S_ISLNK: "symbolic link", stat.S_ISDIR: "folder", stat.S_ISFIFO: "FIFO", stat.S_ISCHR: "device",
                 stat.S_ISBLK: "device", stat.S_ISSOCK: "socket"}  # fmt: skip
        kind = next((name for test, name in kinds.items() if test(mode)), "special file")
        raise UserError(f"refusing to write {path}: it is a {kind}, not a regular file; give a file name")


def write_records(path: Path, records: Iterable[dict]) -> int:
    """Write records as JSON Lines (gzip-compressed when `path` ends in .gz), sorted by run key so that
    two exports of the same runs are the same file; written beside `path` and renamed over it, so an
    interrupted export never leaves a half-written file under the name, and the next export to the name
    removes what a killed one left beside it. Only a regular file (or a new name) is written: a symlink,
    device, FIFO or folder there is refused. Returns the count."""
    from gflbench.data import partial_path, remove_stale_partials

    path = Path(path)
    _check_target(path)
    rows = sorted(records, key=lambda r: r["run_key"])
    partial = partial_path(path, hidden=True)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # what an export to this name killed midway left (`.<name>.<host>-<pid>.partial`); nothing else there
        remove_stale_partials(path.parent, f".{glob.escape(path.name)}.*.partial")
        with open(partial, "xb") as raw:  # a new file of our own: never through a link someone placed there
            # no name and mtime 0 in the gzip header, so the same runs give the same bytes
            out = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) if path.suffix == ".gz" else raw
            with out:
                for record in rows:
                    out.write((_json(record) + "\n").encode())
        os.replace(partial, path)
    except OSError as error:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise UserError(f"cannot write {path}: {error}") from None
    return len(rows)


@dataclass(frozen=True)
class Imported:
    """A record read from a `write_records` file, with where it was read (for messages)."""

    record: dict
    where: str  # "FILE, line N"


def read_records(path: Path) -> list[Imported]:
    """Every record of a `write_records` file, each checked before any is stored (`check_record`) and then
    brought up to today's keys (`upgrades.upgrade_record`: a file written before a field of its method existed
    imports under the keys today's specs give): a file that is not JSON Lines, a non-finite number, or a line
    that is not a consistent run record is a UserError naming the file and line."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    records = []
    try:
        with opener(path, "rt", encoding="utf-8") as file:
            for number, line in enumerate(file, 1):
                if not line.strip():
                    continue
                where = f"{path}, line {number}"
                try:
                    record = json.loads(line, parse_constant=_refuse_constant)
                except json.JSONDecodeError as error:
                    raise UserError(f"{where}: not JSON ({error.msg})") from None
                except ValueError as error:
                    raise UserError(f"{where}: {error}") from None
                problem = check_record(record)
                if problem:
                    raise UserError(f"{where}: {problem}; nothing was imported")
                records.append(Imported(upgrade_record(record), where))
    except (OSError, EOFError, UnicodeDecodeError) as error:
        raise UserError(f"cannot read {path}: {error}") from None
    return records


def _refuse_constant(token: str) -> None:
    """json.loads' hook for NaN, Infinity and -Infinity, which Python reads but JSON does not have."""
    raise ValueError(f"non-finite number {token} (JSON has no NaN or Infinity; gflbench writes null); "
                     "nothing was imported")  # fmt: skip
