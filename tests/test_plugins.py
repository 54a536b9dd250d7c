"""A researcher's own method, installed as a package with a `gflbench.methods` entry point."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = "import sys; from gflbench.commands.app import app; sys.argv[0] = 'gflbench'; app()"

PLUGIN = '''
"""FedAvg with clipped updates."""
from dataclasses import dataclass

import torch

from gflbench.baselines.fedavg import FedAvgClient, FedAvgParams, FedAvgServer
from gflbench.core.method import Method, log_range, positive


@dataclass(frozen=True)
class ClipParams(FedAvgParams):
    bounds = {"clip": positive()}
    search_space = {**FedAvgParams.search_space, "clip": log_range(0.1, 10.0)}
    clip: float = 1.0


class ClipServer(FedAvgServer):
    def aggregate(self, rnd, uploads) -> None:
        old = self.global_weights
        deltas = []
        for upload in uploads.values():
            delta = {k: upload["weights"][k] - old[k] for k in old}
            norm = torch.sqrt(sum((d**2).sum() for d in delta.values()))
            scale = min(1.0, self.params.clip / (float(norm) + 1e-12))
            deltas.append({k: d * scale for k, d in delta.items()})
        self.global_weights = {k: old[k] + sum(d[k] for d in deltas) / len(deltas) for k in old}


class FedAvgClip(Method):
    name = "fedavg-clip"
    title = "FedAvg (clipped)"
    summary = "FedAvg; each client's update clipped to norm C before the mean"
    Params = ClipParams
    client = FedAvgClient
    server = ClipServer
'''


def _install(site: Path) -> None:
    """What `pip install` leaves on sys.path: the module and a dist-info folder with its entry points."""
    (site / "my_methods").mkdir(parents=True)
    (site / "my_methods" / "__init__.py").write_text("")
    (site / "my_methods" / "fedavg_clip.py").write_text(PLUGIN)
    info = site / "my_methods-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-methods\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(
        textwrap.dedent("""
        [gflbench.methods]
        fedavg-clip = my_methods.fedavg_clip:FedAvgClip
        """)
    )


def _gflbench(args: list[str], tmp_path: Path, site: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{site}:{ROOT}", "GFLBENCH_DATA": str(tmp_path / "data"),
           "GFLBENCH_RESULTS": str(tmp_path / "runs.sqlite"), "HOME": str(tmp_path)}  # fmt: skip
    return subprocess.run([sys.executable, "-c", CODE, *args], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def test_an_installed_plugin_is_listed_run_and_tabulated(tmp_path):
    site = tmp_path / "site"
    _install(site)
    listing = _gflbench(["methods"], tmp_path, site)
    assert listing.returncode == 0 and "fedavg-clip" in listing.stdout and "clip=1.0" in listing.stdout

    ran = _gflbench(["run", "-m", "fedavg-clip,fedavg", "-d", "tiny", "--clients", "5", "--seeds", "1",
                     "--rounds", "4", "--set", "fedavg-clip.clip=0.5"], tmp_path, site)  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    table = _gflbench(["table", "-d", "tiny", "--rounds", "4", "--seeds", "1", "-f", "csv",
                       "--set", "fedavg-clip.clip=0.5"], tmp_path, site)  # fmt: skip
    assert table.returncode == 0, table.stderr
    rows = {line.split(",")[0]: line.split(",")[1] for line in table.stdout.splitlines() if "," in line}
    assert "±" in rows["FedAvg (clipped) [gcn]"] and rows["FedAvg (clipped) [gcn]"] != rows["FedAvg [gcn]"]

    bad = _gflbench(["run", "-m", "fedavg-clip", "-d", "tiny", "--set", "fedavg-clip.clip=-1"], tmp_path, site)
    assert bad.returncode == 2 and "fedavg-clip.clip=-1.0 is out of range" in bad.stderr
