"""Where a number came from: package versions, the code's git commit and the device."""

from __future__ import annotations

import functools
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

PACKAGES = ("gflbench", "torch", "torch_geometric", "pymetis", "POT", "numpy", "scipy", "ogb")


@functools.cache
def _versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    versions["python"] = platform.python_version()
    return versions


@functools.cache
def git_commit() -> str:
    """HEAD of the checkout this code runs from, with `-dirty` if it has uncommitted changes."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def provenance(device: torch.device) -> dict[str, Any]:
    return {
        "versions": _versions(),
        "git_commit": git_commit(),
        "device": str(device),
        "device_name": device_name(device),
    }
