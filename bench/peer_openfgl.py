"""Peer mode: seconds per round of gflbench and of OpenFGL on the same federation, side by side.

    python bench/peer_openfgl.py --rounds 15                    # OpenFGL installed in the venv
    python bench/peer_openfgl.py --openfgl /path/to/OpenFGL    # or a clone put on sys.path
    python bench/peer_openfgl.py --batched                      # gflbench side on its batched path

Getting OpenFGL without disturbing gflbench's pinned packages (its pyproject declares only
`requests`, so `--no-deps` loses nothing it needs for these five methods):

    git clone https://github.com/xkLi-Allen/OpenFGL ../openfgl
    pip install --no-deps -e ../openfgl

OpenFGL imports some packages at module level that the five methods measured here never call:
`munkres` (clustering metrics), `sknetwork` (Louvain simulation), `torch_sparse` (SparseTensor
branches) and `torch_scatter` (one `scatter_add` in FED-PUB's degree normalisation). Where one is
not installed the script puts a stub in its place and says so; the `scatter_add` stub is PyG's
`scatter(..., reduce="sum")`, the same sum. Installing the real packages makes the stubs unused.

Identical work on both sides. Both train on gflbench's Cora (largest connected component) split
over `--clients` METIS clients, gflbench's per-client train/validation/test nodes, a GCN of width
`--hidden`, `--epochs` local epochs of full-batch Adam (lr, weight decay as given) per round,
every client every round, and every client's local model evaluated on its own nodes after every
round. The script writes gflbench's partition into OpenFGL's processed-data layout
(`<root>/distrib/subgraph_fl_metis_Cora_client_<n>/`, data and split files), so OpenFGL runs no
partitioning or splitting of its own; OpenFGL's server still loads its full-Cora global graph
(raw files copied from the gflbench mirror into `<root>/global/subgraph_fl/Cora/raw`), which no
per-round step reads in this evaluation mode. A round is timed the same way on both sides: from the
end of one round's evaluation to the end of the next (gflbench: the runner's `on_round` callback;
OpenFGL: the return of `FGLTrainer.evaluate` inside its own `train` loop), as wall time and as this
process's CPU time (`time.process_time`; steadier than wall time on a machine shared with other
jobs). Set-up before the first round (gflbench: loading the federation; OpenFGL: building
FGLTrainer, which includes FedSage+'s impaired graphs and FedTAD's class reliability) is reported
apart; gflbench's per-run set-up inside `run` lands in round 1, which the warm-up leaves out.

Known differences that remain (method parameters keep each side's defaults): gflbench's GCN is
two GCN layers then a linear classifier, on a normalised adjacency computed once; OpenFGL's is two
GCN layers, normalising inside every forward. FedSage+ (OpenFGL: 10 generator rounds, then
classifier rounds; gflbench: generator phase in round 0) and FED-PUB (proxy graph sizes) spend
their time differently across rounds, so the mean over rounds is shown next to the median; for
FedSage+ run `--methods fedsage+ --warmup 0 --json FILE` and read the phases from FILE's rounds.

Every measurement runs in its own process (clean peak RSS: the process's high-water mark, imports
and data included), gflbench and OpenFGL interleaved per method. FedTAD runs on the gflbench side
only if `gflbench methods` lists it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import pickle
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import torch
from timing import RoundClock

OURS_TO_THEIRS = {
    "fedavg": "fedavg",
    "fedprox": "fedprox",
    "fedpub": "fedpub",
    "fedsage+": "fedsage_plus",
    "fedtad": "fedtad",
}
RESULT_MARK = "PEER-RESULT "


def main() -> None:
    args = _parser().parse_args()
    if args.worker:
        _worker(args)
        return
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in OURS_TO_THEIRS]
    if unknown:
        raise SystemExit(f"no OpenFGL counterpart for {', '.join(unknown)}; choose from {', '.join(OURS_TO_THEIRS)}")
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="openfgl-peer-"))
    export_federation(root, args.clients)
    results: dict[tuple[str, str], dict] = {}
    try:
        for method in methods:  # interleaved: a drift in machine load hits both sides alike
            for side in ("gflbench", "openfgl"):
                results[side, method] = _spawn(args, side, method, root)
                print(f"{side:8s} {method:9s} {_short(results[side, method])}", file=sys.stderr, flush=True)
    finally:
        if not args.root:
            shutil.rmtree(root, ignore_errors=True)
    print_table(args, methods, results)
    if args.json:  # every round of every cell, for a split the table does not show (FedSage+'s phases)
        Path(args.json).write_text(
            json.dumps({f"{side} {method}": r for (side, method), r in results.items()}, indent=1)
        )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default=",".join(OURS_TO_THEIRS), help="gflbench names, comma-separated")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=1, help="leading rounds left out of the median and mean")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3, help="local epochs per round")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--weight-decay", type=float, default=5e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (both sides)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--batched", action="store_true", help="gflbench side: train a batchable method's clients together"
    )
    parser.add_argument("--timeout", type=float, default=900, help="seconds per measurement process")
    parser.add_argument("--openfgl", default="", help="an OpenFGL clone to put on sys.path (else: the installed one)")
    parser.add_argument(
        "--root", default="", help="OpenFGL's dataset root (default: a temporary folder, removed after)"
    )
    parser.add_argument("--json", default="", help="also write every round's times to this JSON file")
    parser.add_argument("--worker", choices=("gflbench", "openfgl"), help=argparse.SUPPRESS)
    parser.add_argument("--method", help=argparse.SUPPRESS)
    return parser


# ---------------------------------------------------------------- data: gflbench's federation in OpenFGL's layout


def export_federation(root: Path, clients: int) -> Path:
    """Write gflbench's Cora METIS federation where OpenFGL's FGLDataset looks for processed data.

    FGLDataset skips its own simulation when every `data_<i>.pt` exists; NodeClsTask skips its own
    split when the six split files of a client exist. Returns the processed folder.
    """
    from torch_geometric.data import Data

    from gflbench.data import dataset_spec, default_data_dir
    from gflbench.experiments.runner import DataCache

    data_root = default_data_dir()
    federation = DataCache(data_root, data_root / "partitions").federated("cora", "metis", clients, 1234)
    processed = root / "distrib" / f"subgraph_fl_metis_Cora_client_{clients}"
    split_dir = processed / "node_cls" / "default_split"
    split_dir.mkdir(parents=True, exist_ok=True)
    for cid, graph in enumerate(federation.graphs):
        global_ids = graph.global_id.tolist()
        client = Data(x=graph.x.clone(), y=graph.y.clone(), edge_index=graph.edge_index.clone())
        client.global_map = dict(enumerate(global_ids))
        client.num_global_classes = federation.num_classes
        torch.save(client, processed / f"data_{cid}.pt")
        for part in ("train", "val", "test"):
            mask = getattr(graph, f"{part}_mask")
            torch.save(mask.clone(), split_dir / f"{part}_{cid}.pt")
            with open(split_dir / f"glb_{part}_{cid}.pkl", "wb") as file:
                pickle.dump([global_ids[i] for i in mask.nonzero().flatten().tolist()], file)
    _copy_global_raw(root, dataset_spec("cora"), data_root)
    return processed


def _copy_global_raw(root: Path, spec, data_root: Path) -> None:
    """OpenFGL's server loads Planetoid Cora from `<root>/global/subgraph_fl/Cora/raw`."""
    mirror = os.environ.get("GFLBENCH_RAW_MIRROR")
    source = Path(mirror) / spec.folder / "raw" if mirror else data_root / spec.folder / "raw"
    target = root / "global" / "subgraph_fl" / "Cora" / "raw"
    target.mkdir(parents=True, exist_ok=True)
    for path in source.glob("ind.cora.*"):
        if not (target / path.name).exists():
            shutil.copyfile(path, target / path.name)
    if not any(target.iterdir()):
        raise SystemExit(f"no Cora raw files in {source}; set GFLBENCH_RAW_MIRROR to a PyG raw layout")


# ---------------------------------------------------------------- one measurement per process


def _spawn(args: argparse.Namespace, side: str, method: str, root: Path) -> dict:
    """Run one side's measurement of one method in a fresh process and return its result dict."""
    command = [sys.executable, __file__, "--worker", side, "--method", method, "--root", str(root)]
    for name in ("rounds", "clients", "hidden", "epochs", "lr", "weight_decay", "seed", "device", "threads", "openfgl"):
        command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    command += ["--batched"] if args.batched else []
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"over the {args.timeout:.0f} s limit"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK) :])
    tail = (done.stderr or done.stdout).strip().splitlines()
    return {"error": tail[-1] if tail else f"exit code {done.returncode}"}


def _worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    try:
        result = measure_gflbench(args) if args.worker == "gflbench" else measure_openfgl(args)
    except Exception as error:  # reported as the cell's reason, not a crash of the whole table
        result = {"error": f"{type(error).__name__}: {error}"[:300]}
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    print(RESULT_MARK + json.dumps(result), flush=True)


def measure_gflbench(args: argparse.Namespace) -> dict:
    """gflbench's runner on the shared settings; per-round time = exchange + evaluation."""
    from gflbench.core.method import all_methods
    from gflbench.data import default_data_dir
    from gflbench.experiments.runner import DataCache, resolve_device, run
    from gflbench.experiments.spec import make_spec

    if args.method not in all_methods():
        return {"error": f"not in gflbench (gflbench methods does not list {args.method})"}
    tic = time.perf_counter()
    data_root = default_data_dir()
    data = DataCache(data_root, data_root / "partitions").federated("cora", "metis", args.clients, 1234)
    overrides = {"hidden": str(args.hidden), "lr": str(args.lr), "weight_decay": str(args.weight_decay)}
    spec = make_spec(args.method, "cora", "metis", args.clients, args.seed, overrides, args.rounds, args.epochs)
    clock = RoundClock()
    record = run(spec, data, resolve_device(args.device), on_round=lambda *_: clock.mark(), batched=args.batched)
    setup = clock.wall[0] - tic
    return {**clock.rounds(), "setup": setup, "test": record["test"], "backbone": spec.params.backbone,
            "execution": record["execution"]}  # fmt: skip


def measure_openfgl(args: argparse.Namespace) -> dict:
    """OpenFGL's own FGLTrainer.train loop; a round ends when its `evaluate` returns."""
    stubbed = install_stubs()
    if args.openfgl:
        sys.path.insert(0, args.openfgl)
    os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # OpenFGL torch.load()s Data objects it wrote
    argv, sys.argv = sys.argv, sys.argv[:1]  # openfgl.config parses sys.argv when imported
    try:
        from openfgl.config import parser as openfgl_parser
        from openfgl.flcore.trainer import FGLTrainer
        from openfgl.utils.basic_utils import seed_everything
    finally:
        sys.argv = argv
    options = openfgl_parser.parse_args([
        "--root", args.root, "--scenario", "subgraph_fl", "--dataset", "Cora", "--simulation_mode", "subgraph_fl_metis",
        "--num_clients", str(args.clients), "--num_rounds", str(args.rounds), "--fl_algorithm", OURS_TO_THEIRS[args.method],
        "--task", "node_cls", "--model", "gcn", "--hid_dim", str(args.hidden), "--num_epochs", str(args.epochs),
        "--lr", str(args.lr), "--weight_decay", str(args.weight_decay), "--metrics", "accuracy", "--seed", str(args.seed),
        "--evaluation_mode", "local_model_on_local_data",
    ])  # fmt: skip
    options.use_cuda = args.device.startswith("cuda")  # its flag is type=bool, so "False" would parse as True
    seed_everything(args.seed)
    tic = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        trainer = FGLTrainer(options)
    clock = RoundClock()
    evaluate = trainer.evaluate

    def timed_evaluate() -> None:
        evaluate()
        if trainer.device.type == "cuda":
            torch.cuda.synchronize(trainer.device)
        clock.mark()

    trainer.evaluate = timed_evaluate
    with contextlib.redirect_stdout(io.StringIO()):  # it prints every client's metrics every round
        trainer.train()
    result = trainer.evaluation_result
    return {**clock.rounds(), "setup": clock.wall[0] - tic, "test": result.get("best_test_accuracy"), "stubbed": stubbed,
            "device": str(trainer.device)}  # fmt: skip


def install_stubs() -> list[str]:
    """Stand-ins for OpenFGL's module-level imports that these five methods never call; see the docstring."""
    from torch_geometric.typing import SparseTensor
    from torch_geometric.utils import scatter

    def unused(name: str):
        def fail(*_args, **_kwargs):
            raise RuntimeError(f"{name} is a stub in bench/peer_openfgl.py; install the real package")

        return fail

    def scatter_add(src, index, dim=-1, out=None, dim_size=None):
        return scatter(src, index, dim=dim, dim_size=dim_size, reduce="sum")

    stubs = {
        "munkres": {"Munkres": unused("munkres.Munkres")},
        "sknetwork": {"clustering": types.SimpleNamespace(Louvain=unused("sknetwork.clustering.Louvain"))},
        "torch_scatter": {"scatter_add": scatter_add},
        "torch_sparse": {
            "SparseTensor": SparseTensor,
            "fill_diag": unused("torch_sparse.fill_diag"),
            "matmul": unused("torch_sparse.matmul"),
            "mul": unused("torch_sparse.mul"),
            "sum": unused("torch_sparse.sum"),
        },
    }
    stubbed = []
    for name, attributes in stubs.items():
        if name in sys.modules or importlib.util.find_spec(name) is not None:
            continue
        module = types.ModuleType(name)
        module.__dict__.update(attributes)
        sys.modules[name] = module
        if name == "sknetwork":  # `from sknetwork.clustering import Louvain` needs the submodule registered too
            sys.modules["sknetwork.clustering"] = attributes["clustering"]
        stubbed.append(name)
    return stubbed


# ---------------------------------------------------------------- report


def _summary(values: list[float], warmup: int) -> tuple[float, float]:
    timed = values[warmup:] or values
    return statistics.median(timed), statistics.fmean(timed)


def _short(result: dict) -> str:
    if "error" in result:
        return f"failed: {result['error']}"
    wall, cpu = _summary(result["seconds"], 1)[0], _summary(result["cpu"], 1)[0]
    return f"median {wall:.4f} s/round wall, {cpu:.4f} CPU, setup {result['setup']:.1f} s, peak {result['peak_rss_mb']:.0f} MB"


def print_table(args: argparse.Namespace, methods: list[str], results: dict[tuple[str, str], dict]) -> None:
    """A Markdown table: per method, both sides' wall and CPU seconds per round, ratios, set-up, peak RSS."""
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {args.threads} torch thread(s), {args.device}"
    print(f"Cora, METIS {args.clients} clients, GCN hidden {args.hidden}, {args.epochs} local epochs, lr {args.lr}, "
          f"weight decay {args.weight_decay}, {args.rounds} rounds ({args.warmup} warm-up left out), evaluation every round "
          f"included; {machine}; torch {torch.__version__}; median (mean) over rounds; ratio = gflbench / OpenFGL"
          f"{'; gflbench batched where the method batches (execution noted below)' if args.batched else ''}")  # fmt: skip
    print()
    print("| method | gflbench wall s/round | OpenFGL wall s/round | ratio wall | gflbench CPU s/round | OpenFGL CPU s/round "
          "| ratio CPU | set-up s (gflbench / OpenFGL) | peak RSS MB (gflbench / OpenFGL) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    notes = []
    for method in methods:
        ours, theirs = results["gflbench", method], results["openfgl", method]
        for name, result in (("gflbench", ours), ("OpenFGL", theirs)):
            if "error" in result:
                notes.append(f"{method}, {name}: {result['error']}")
        cells = []
        for key in ("seconds", "cpu"):
            sides = [_summary(r[key], args.warmup) if "error" not in r else None for r in (ours, theirs)]
            cells += ["{:.4f} ({:.4f})".format(*side) if side else "—" for side in sides]
            cells.append(f"{sides[0][0] / sides[1][0]:.2f} ({sides[0][1] / sides[1][1]:.2f})" if all(sides) else "—")
        setup = " / ".join(f"{r['setup']:.1f}" if "setup" in r else "—" for r in (ours, theirs))
        peak = " / ".join(f"{r['peak_rss_mb']:.0f}" if "error" not in r else "—" for r in (ours, theirs))
        print(f"| {method} | " + " | ".join(cells) + f" | {setup} | {peak} |")
    if args.batched:
        notes += [f"{m}, gflbench execution: {results['gflbench', m].get('execution', '—')}" for m in methods]
    stubbed = sorted({s for (side, _), r in results.items() if side == "openfgl" for s in r.get("stubbed", [])})
    if stubbed:
        notes.append(f"OpenFGL ran with stubs for {', '.join(stubbed)} (not installed)")
    for note in notes:
        print(f"\n- {note}")


if __name__ == "__main__":
    main()
