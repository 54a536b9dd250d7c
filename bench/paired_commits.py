"""Seconds per round of two source trees of gflbench, run as interleaved pairs: the "before and after" of a change.

    git worktree add /tmp/before <commit>
    python bench/paired_commits.py --before /tmp/before --pairs 7 -- --method fedavg --clients 20 --batched

Each pair runs bench/across_commits.py once from each tree, in separate processes, alternating which
goes first, so that load from other processes falls on both alike. Each tree is made importable by
itself (`import_root`): its folders under the import names its pyproject.toml maps them to, and its own
entry points, first on PYTHONPATH, so one virtual environment serves both as long as their dependencies
agree (an editable install of either tree is shadowed). The arguments after `--` go to across_commits.py unchanged; its median CPU
seconds per round (rounds 4 onwards) is what is compared. Prints each pair, then the median of the
per-pair ratios after/before (below 1: the current tree is faster), with the machine, its core
count and its load average before and after. Each run gets `--threads` CPU threads (default 1): on a
machine shared with other work, torch's threads waiting for a busy core count as CPU time, which made
one commit's two-thread rounds vary between 0.2 and 1 s. Nothing is stored.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import tomllib  # Python 3.11 or later: these bench scripts are run by developers, not by the package

HERE = Path(__file__).resolve().parent
FIGURES = re.compile(r"median s/round CPU (?P<cpu>[0-9.]+) wall (?P<wall>[0-9.]+) \(test (?P<test>[0-9.]+)\)")


def import_root(tree: Path, folder: Path) -> Path:
    """A folder from which `tree` imports as its installed distribution would: every package the tree's
    pyproject.toml maps (`package-dir`, e.g. gfl_bench/ as `gflbench`) linked under its import name, and a
    dist-info with the tree's entry points, so that the method registry loads the tree's own methods. A tree
    with no mapping imports from its root, with the entry points beside it."""
    project = tomllib.loads((tree / "pyproject.toml").read_text())
    mapping = project.get("tool", {}).get("setuptools", {}).get("package-dir", {})
    root = folder
    root.mkdir()
    for name, folder in sorted(mapping.items()):  # parents first: "gflbench" before "gflbench.baselines"
        target = root.joinpath(*name.split("."))
        target.mkdir(parents=True, exist_ok=True)
        for child in (tree / folder).iterdir():
            if not target.joinpath(child.name).exists():
                target.joinpath(child.name).symlink_to(child)
    if not mapping:
        for child in tree.iterdir():
            if child.suffix == ".py" or (child / "__init__.py").is_file():
                root.joinpath(child.name).symlink_to(child)
    info = root / f"{project['project']['name']}-0.dist-info"
    info.mkdir()
    info.joinpath("METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['project']['name']}\nVersion: 0\n")
    groups = project["project"].get("entry-points", {}) | {"console_scripts": project["project"].get("scripts", {})}
    info.joinpath("entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{key} = {value}\n" for key, value in points.items())
            for group, points in groups.items()
        )
    )
    return root


def seconds(tree: Path, root: Path, label: str, args: list[str], threads: int) -> dict[str, float]:
    """One across_commits.py run of `tree`, imported from its `import_root`: its CPU and wall seconds per round
    and its test accuracy."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(HERE)]), "OMP_NUM_THREADS": str(threads)}
    command = [sys.executable, str(HERE / "across_commits.py"), "--label", label, *args]
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} (in {tree}) failed:\n{done.stderr[-3000:]}")
    out = done.stdout
    found = FIGURES.search(out)
    if found is None:
        raise SystemExit(f"no timing in the output of {' '.join(command)}:\n{out}")
    return {key: float(value) for key, value in found.groupdict().items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="source tree of the older commit (a worktree)")
    parser.add_argument("--after", type=Path, default=HERE.parent, help="source tree of the newer one (default: this)")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch's CPU threads in each run (OMP_NUM_THREADS)")
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="-- then the arguments for across_commits.py")
    args = parser.parse_args()
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    if args.pairs < 1 or not (args.before / "gfl_bench").is_dir():
        parser.error("--pairs must be at least 1 and --before a gflbench source tree")

    load = os.getloadavg()
    print(f"{platform.node()}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"{args.threads} thread(s) per run, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; across_commits.py {' '.join(rest)}")  # fmt: skip
    ratios = []
    scratch = Path(tempfile.mkdtemp())
    try:
        roots = {
            label: import_root(tree.resolve(), scratch / label)
            for label, tree in (("before", args.before), ("after", args.after))
        }
        for pair in range(args.pairs):
            trees = [("before", args.before), ("after", args.after)]
            if pair % 2:
                trees.reverse()
            figures = {label: seconds(tree, roots[label], label, rest, args.threads) for label, tree in trees}
            ratio = figures["after"]["cpu"] / figures["before"]["cpu"]
            ratios.append(ratio)
            print(f"pair {pair + 1}: before {figures['before']['cpu']:.4f} s, after {figures['after']['cpu']:.4f} s "
                  f"(CPU per round), after/before {ratio:.3f}; test {figures['before']['test']:.4f} / "
                  f"{figures['after']['test']:.4f}", flush=True)  # fmt: skip
    finally:
        shutil.rmtree(scratch)
    load = os.getloadavg()
    print(f"median after/before over {len(ratios)} pairs: {statistics.median(ratios):.3f} "
          f"(range {min(ratios):.3f}-{max(ratios):.3f}); load average now {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
