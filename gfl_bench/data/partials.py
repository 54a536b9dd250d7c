"""Atomic writes: a file is written under a `.partial` name of its own, then renamed into place; the leftovers
of a killed writer are removed, those of a live one never."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path


def partial_path(target: Path, hidden: bool = False) -> Path:
    """Where to write `target` before the atomic rename: named by host and process, so that
    `remove_stale_partials` can tell a dead writer's leftover from a file still being written; `hidden`
    starts the name with a dot (an export, written into a folder of the user's)."""
    return target.with_name(f"{'.' if hidden else ''}{target.name}.{_HOST}-{os.getpid()}.partial")


_HOST = socket.gethostname().replace(".", "_")


def remove_stale_partials(folder: Path, pattern: str = "*.partial") -> None:
    """Remove the `.partial` files in `folder` matching `pattern` whose writer, a process of this host, is
    gone (killed between writing and renaming).

    Files of processes still running, and of other hosts sharing the folder, are left alone, so a file
    another process is writing is never removed under it. A name with a process id but no host (written
    before hosts were named) counts as this host's. Where the folder is not gflbench's alone (an export's),
    the caller's `pattern` matches only its own names."""
    for path in folder.glob(pattern):
        tag = path.name[: -len(".partial")].rsplit(".", 1)[-1]
        host, _, pid = tag.rpartition("-")
        if not pid.isdigit() or host not in ("", _HOST) or _process_exists(int(pid)):
            continue
        with contextlib.suppress(OSError):  # another process may have removed it first
            path.unlink()


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True
