"""Where a number came from: package versions, the code's git commit, the device and, on a CPU, which CPU."""

from __future__ import annotations

import functools
import hashlib
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
    found = {
        "versions": _versions(),
        "git_commit": git_commit(),
        "device": str(device),
        "device_name": device_name(device),
    }
    if device.type == "cpu":
        found["cpu"] = cpu_identity()
    return found


@functools.cache
def cpu_identity() -> dict[str, str]:
    """Which CPU computed a CPU run, as far as it can change the arithmetic: the vector instruction set torch's
    kernels dispatch on, and a digest of the CPU's model and feature flags (MKL and oneDNN pick their kernels by
    those). Runs on VMs that agree on both are taken as one execution, so a disagreement between them is a conflict
    `import` reports; runs that differ are another execution (core/execution.py), kept beside each other so the
    spread between machines is measured, not hidden.
    docs/protocol.md, "Executions and the execution band"."""
    found: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():  # every core repeats them: the first wins
            name, _, value = line.partition(":")
            found.setdefault(name.strip(), value.strip())
    except OSError:  # not Linux: the model and machine alone
        pass
    model = found.get("model name") or platform.processor() or platform.machine()
    flags = " ".join(sorted(found.get("flags", "").split()))
    digest = hashlib.sha256(f"{model}|{flags}".encode()).hexdigest()[:8]
    return {"model": model, "capability": torch.backends.cpu.get_cpu_capability().lower(), "digest": digest}
