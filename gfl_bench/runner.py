"""The federated runner: one RunSpec in, one run record out (`run`); or several seeds of one
batchable configuration stepped together, one record each (`run_together`, `--stack-seeds`).

Protocol (docs/protocol.md): every client takes part in every round; per round the method's
exchanges run, then each client's own model, right after its local training, is evaluated on its
local validation and test nodes. The round's value is the plain mean over clients (the node-weighted
mean is stored too); the reported test value is the one at the round with the best client-mean
validation value. Seconds per round cover configure, local training and aggregation, with CUDA
synchronised and evaluation excluded. All data and models stay on one device for the whole run.
"""

from __future__ import annotations

import contextlib
import copy
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data

from gfl_bench.allocator import keep_freed_memory, release_excess_heap
from gfl_bench.backbones import backbone_class, build_backbone, prepared_key
from gfl_bench.batched import BatchedTraining, batched_trainer
from gfl_bench.datasets import data_fingerprint, dataset_spec, load_dataset, partial_path, remove_stale_partials
from gfl_bench.errors import UserError
from gfl_bench.exchange import Exchange, exchange
from gfl_bench.method import Client, MethodParams, Round, Server, Setup, method_class
from gfl_bench.metrics import defined_on, metric_fn
from gfl_bench.partition import Partition, cached_partition, client_graphs
from gfl_bench.provenance import provenance
from gfl_bench.randomness import RunRandomness, SharedRandomness, nondeterministic_kernels, seed_everything
from gfl_bench.records import best_round, per_client_best
from gfl_bench.spec import RunSpec
from gfl_bench.store import finite

RoundCallback = Callable[[int, float, float], None]


class RunFailed(RuntimeError):
    """A run that cannot produce numbers (non-finite predictions); it is stored as failed, not retried."""


def resolve_device(name: str) -> torch.device:
    """`auto` picks CUDA when present; an explicit device that is not there is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("device cuda was asked for, but torch sees no CUDA device")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise UserError(f"device {name} is not there: torch sees {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    return device


@dataclass
class FederatedData:
    """One dataset split over clients: the CPU graphs, and device copies prepared per backbone."""

    dataset: str
    metric: str
    num_features: int
    num_classes: int
    partition: Partition
    graphs: list[Data]
    prepared: dict[tuple, list[Data]] = field(default_factory=dict)
    data_fingerprint: str | None = None  # datasets.data_fingerprint of the preprocessed global graph

    def on_device(self, params: MethodParams, device: torch.device) -> list[Data]:
        """Client graphs with the operators of the backbone `params` names, on `device`; computed once
        per (backbone, its options, device), then shared.

        Each run gets shallow copies, so a method may replace attributes of its graphs (a mended
        or expanded graph) without touching other runs; tensors must not be changed in place.
        """
        key = (*prepared_key(params), str(device))
        if key not in self.prepared:
            prepared = []
            for graph in self.graphs:
                g = copy.copy(graph)
                backbone_class(params.backbone).prepare(g, params)
                prepared.append(g.to(device))
            self.prepared[key] = prepared
        return [copy.copy(g) for g in self.prepared[key]]


class DataCache:
    """Loads each dataset and partition once per process: a grid reuses them across methods and seeds."""

    def __init__(self, data_dir: Path | None, partition_dir: Path | None) -> None:
        self.data_dir = data_dir
        self.partition_dir = partition_dir
        self._graphs: dict[str, Data] = {}
        self._federated: dict[tuple[str, str, int, int], FederatedData] = {}

    def graph(self, dataset: str) -> Data:
        if dataset not in self._graphs:
            self._graphs[dataset] = load_dataset(dataset, self.data_dir)
        return self._graphs[dataset]

    def federated(self, dataset: str, scheme: str, clients: int, data_seed: int) -> FederatedData:
        key = (dataset, scheme, clients, data_seed)
        if key not in self._federated:
            spec = dataset_spec(dataset)
            graph = self.graph(dataset)
            partition = cached_partition(graph, dataset, scheme, clients, data_seed, spec.split, self.partition_dir)
            self._federated[key] = FederatedData(
                dataset=dataset,
                metric=spec.metric,
                num_features=graph.num_features,
                num_classes=int(graph.y.max()) + 1,
                partition=partition,
                graphs=client_graphs(graph, partition),
                data_fingerprint=data_fingerprint(graph),
            )
        return self._federated[key]


def check_measurable(data: FederatedData) -> None:
    """Refuse, before any run, a setting whose validation or test metric no client has: a client
    without the nodes a metric needs is left out of that split's client mean (`excluded_clients` in the
    record), but with none left the run would have no value to report or select by."""
    setting = f"{data.dataset} {data.partition.scheme}-{data.partition.num_clients}"
    need = "nodes of both classes" if data.metric == "roc_auc" else "nodes"
    for split in ("val", "test"):
        if not any(defined_on(data.metric, g.y[getattr(g, f"{split}_mask")]) for g in data.graphs):
            raise UserError(f"{setting}: no client has {split} {need}, so {data.metric} cannot be measured; "
                            "choose fewer clients")  # fmt: skip


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _nanmean(values: Tensor, weights: Tensor | None = None) -> Tensor:
    valid = ~torch.isnan(values)
    if weights is None:
        weights = torch.ones_like(values)
    w = weights * valid
    return (torch.where(valid, values, 0.0) * w).sum() / w.sum()


def run(
    spec: RunSpec,
    data: FederatedData,
    device: torch.device,
    on_round: RoundCallback | None = None,
    snapshot_rounds: frozenset[int] = frozenset(),
    snapshot_dir: Path | None = None,
    batched: bool = False,
    sparse_features: bool = False,
) -> dict:
    """Train `spec` on `data` and return its record (see gfl_bench/store.py for the fields).

    At each round in `snapshot_rounds` the server's `snapshot()` is saved to
    `snapshot_dir/<run_key>/round<r>.pt` for case-study figures. With `batched`, a method that
    declares `batchable` has all its clients' local training done at once (gfl_bench/batched.py);
    the record says which path ran (`execution`). With `sparse_features`, the backbones' first layer
    multiplies a CSR copy of the features (`backbones.input_layer`; the record's `features` says so).
    Both change float summation order only.
    """
    callback = None if on_round is None else (lambda _spec, index, val, test: on_round(index, val, test))
    return run_together([spec], data, device, callback, snapshot_rounds, snapshot_dir, batched, sparse_features)[0]


@dataclass
class _Party:
    """One run while it is stepped: its server and clients, its random streams, and what it records."""

    spec: RunSpec
    server: Server
    clients: list[Client]
    randomness: RunRandomness
    curves: dict[str, list[float]] = field(
        default_factory=lambda: {k: [] for k in ("val", "test", "val_weighted", "test_weighted")}
    )
    client_curves: dict[str, list[list[float]]] = field(default_factory=lambda: {"val": [], "test": []})
    seconds: list[float] = field(default_factory=list)
    phases: dict[str, list[float]] = field(
        default_factory=lambda: {k: [] for k in ("configure", "fit", "aggregate", "evaluate")}
    )
    bytes_up: list[int] = field(default_factory=list)
    bytes_down: list[int] = field(default_factory=list)
    diagnostics: dict[str, list[float]] = field(default_factory=dict)


def stackable(specs: list[RunSpec]) -> bool:
    """Whether these runs can be stepped together: one batchable method and configuration on one
    federation, differing in the run seed only."""
    first = specs[0]
    same = {
        (s.method, s.config_key, s.dataset, s.scheme, s.clients, s.data_seed, s.rounds, s.local_epochs) for s in specs
    }
    return len(same) == 1 and len({s.seed for s in specs}) == len(specs) and method_class(first.method).batchable


def run_together(
    specs: list[RunSpec],
    data: FederatedData,
    device: torch.device,
    on_round: Callable[[RunSpec, int, float, float], None] | None = None,
    snapshot_rounds: frozenset[int] = frozenset(),
    snapshot_dir: Path | None = None,
    batched: bool = False,
    sparse_features: bool = False,
) -> list[dict]:
    """Train several runs of one configuration that differ in their seed, stacked along a seed axis:
    every client of every run in one batched pass per epoch (gfl_bench/batched.py), each run with
    its own server and random streams (gfl_bench/randomness.py), so each record equals the one the
    run gives alone (`run`), up to float summation order. One spec is the plain `run`.

    Timings: configure and aggregation are each run's own; the shared local training and evaluation
    are split evenly, so `seconds_per_round` is the run's share of the stacked round (the record's
    `stacked_runs` says how many shared it). Each record names the kernels without a deterministic
    implementation that ran (`nondeterministic_kernels`, gfl_bench/randomness.py).
    """
    with nondeterministic_kernels() as kernels:
        records = _run_together(specs, data, device, on_round, snapshot_rounds, snapshot_dir, batched, sparse_features)
    return [{**record, "nondeterministic_kernels": sorted(kernels)} for record in records]


def _run_together(
    specs: list[RunSpec],
    data: FederatedData,
    device: torch.device,
    on_round: Callable[[RunSpec, int, float, float], None] | None,
    snapshot_rounds: frozenset[int],
    snapshot_dir: Path | None,
    batched: bool,
    sparse_features: bool,
) -> list[dict]:
    if len(specs) > 1 and not (batched and stackable(specs)):
        raise ValueError("only runs of one batchable configuration differing in their seed stack, with batched=True")
    method = method_class(specs[0].method)
    if device.type == "cpu":
        keep_freed_memory()  # large tensors reused from the heap, not re-mapped (gfl_bench/allocator.py)
    started = time.time()
    memory = _DeviceMemory(device, data.on_device(specs[0].params, device))  # before anything of the run is made
    parties: list[_Party] = []
    for spec in specs:
        seed_everything(spec.seed, device)
        graphs = data.on_device(spec.params, device)
        if sparse_features:
            for graph in graphs:  # shallow copies: the shared prepared graphs stay dense-only
                graph.x_sparse = graph.x.to_sparse_csr()
        setup = Setup(
            num_features=data.num_features,
            num_classes=data.num_classes,
            num_clients=len(graphs),
            rounds=spec.rounds,
            local_epochs=spec.local_epochs,
            device=device,
            seed=spec.seed,
        )
        template = build_backbone(spec.params, data.num_features, data.num_classes).to(device)
        server = method.server(copy.deepcopy(template), spec.params, setup)
        clients = [method.client(cid, g, copy.deepcopy(template), spec.params, setup) for cid, g in enumerate(graphs)]
        randomness = RunRandomness(device) if len(specs) > 1 else SharedRandomness()
        parties.append(_Party(spec, server, clients, randomness))
    everyone = [client for party in parties for client in party.clients]
    streams = [(party.randomness, len(party.clients)) for party in parties]
    trainer = batched_trainer(everyone, specs[0].params.backbone) if batched and method.batchable else None
    if trainer is None and len(specs) > 1:
        raise ValueError(f"{specs[0].method}'s clients cannot be batched here, so its runs cannot stack")
    together: BatchedTraining | None = None  # built at the first stage where every client trains locally
    metric = metric_fn(data.metric)
    graphs = [c.graph for c in parties[0].clients]
    val_counts = torch.tensor([float(g.val_mask.sum()) for g in graphs], device=device)
    test_counts = torch.tensor([float(g.test_mask.sum()) for g in graphs], device=device)
    client_ids = list(range(len(graphs)))
    share = 1.0 / len(parties)

    for index in range(specs[0].rounds):
        _sync(device)
        tic = time.perf_counter()
        own = {id(p): dict.fromkeys(("configure", "aggregate"), 0.0) for p in parties}
        shared = {"fit": 0.0}
        traffic = {id(p): [0, 0] for p in parties}  # bytes down, up
        for stage in range(parties[0].server.stages(index)):
            rnd = Round(index, stage)
            runs = {}
            for p in parties:
                with p.randomness.active(), _timed(own[id(p)], "configure", device):
                    runs[id(p)] = Exchange(p.clients, p.server.configure(rnd, client_ids), p.randomness.active)
            with _timed(shared, "fit", device):
                train_together = trainer is not None and all(c.trains_locally(rnd) for c in everyone)
                if train_together and together is None:  # FedSage+: once its clients have mended their graphs
                    together = trainer(everyone, streams)
                exchange(rnd, list(runs.values()), together.train_round if train_together else None)
            for p in parties:
                traffic[id(p)][0] += runs[id(p)].bytes_down
                traffic[id(p)][1] += runs[id(p)].bytes_up
            for p in parties:
                with p.randomness.active(), _timed(own[id(p)], "aggregate", device):
                    p.server.aggregate(rnd, runs[id(p)].uploads)
        _sync(device)
        elapsed = time.perf_counter() - tic
        own_total = sum(sum(spent.values()) for spent in own.values())
        for p in parties:
            p.seconds.append(sum(own[id(p)].values()) + share * (elapsed - own_total))
            p.phases["configure"].append(own[id(p)]["configure"])
            p.phases["fit"].append(share * shared["fit"])
            p.phases["aggregate"].append(own[id(p)]["aggregate"])
            p.bytes_down.append(traffic[id(p)][0])
            p.bytes_up.append(traffic[id(p)][1])
            for name, value in p.server.diagnostics().items():
                p.diagnostics.setdefault(name, []).append(float(value))
            if index in snapshot_rounds and snapshot_dir is not None:
                _save_snapshot(p.server.snapshot(), Path(snapshot_dir) / p.spec.run_key / f"round{index}.pt")

        evaluated = time.perf_counter()
        scores = together.evaluate(data.metric) if together is not None else None  # every run's clients in one pass
        first = 0
        for p in parties:
            if scores is not None:
                val, test, finite = (s[first : first + len(p.clients)] for s in scores)
                finite = finite.all().float()
            else:
                val, test, finite = _evaluate(p.clients, metric)
            first += len(p.clients)
            means = torch.stack([_nanmean(val), _nanmean(test), _nanmean(val, val_counts), _nanmean(test, test_counts)])
            host = torch.cat([means, val, test, finite.reshape(1)]).tolist()  # the one host sync per run and round
            summary, all_finite = host[:4], host[-1]
            p.client_curves["val"].append(host[4 : 4 + len(p.clients)])
            p.client_curves["test"].append(host[4 + len(p.clients) : -1])
            if not all_finite:
                raise RunFailed(f"non-finite predictions at round {index} (diverged training: NaN or inf)")
            for key, value in zip(p.curves, summary):
                p.curves[key].append(value)
            if on_round is not None:
                on_round(p.spec, index, summary[0], summary[1])
        for p in parties:
            p.phases["evaluate"].append(share * (time.perf_counter() - evaluated))  # the host syncs above end it
        if device.type == "cpu":
            release_excess_heap()  # the kept heap's freed memory stays bounded across rounds (gfl_bench/allocator.py)
    execution = "batched" if together is not None else "per-client"
    peaks = memory.peaks()
    return [_record(p, data, device, started, execution, sparse_features, len(parties), peaks) for p in parties]


def _record(
    party: _Party, data: FederatedData, device: torch.device, started: float, execution: str, sparse_features: bool,
    stacked: int, peaks: dict[str, int],
) -> dict:  # fmt: skip
    """The stored record of one finished run (results/README.md lists the fields). A value undefined for
    a client (NaN: no such node, or a ROC-AUC split lacking a class) is null in it: JSON has no NaN."""
    curves = party.curves
    best = best_round(curves["val"])
    val_client_best, test_client_best = per_client_best(party.client_curves["val"], party.client_curves["test"])
    return finite(
        {
            **_identity(party.spec),
            "metric": data.metric,
            "status": "ok",
            "best_round": best,
            "val": curves["val"][best],
            "test": curves["test"][best],
            "val_weighted": curves["val_weighted"][best],
            "test_weighted": curves["test_weighted"][best],
            "val_client_best": val_client_best,
            "test_client_best": test_client_best,
            "curves": curves,
            "client_curves": party.client_curves,
            "excluded_clients": {split: excluded_clients(party.client_curves[split]) for split in ("val", "test")},
            "seconds_per_round": party.seconds,
            # round 0 apart: it carries one-off work (CUDA and library start-up, FedSage+'s generator phase);
            # the store's summary column is the median of the later rounds (store.round_seconds)
            "first_round_seconds": party.seconds[0],
            "seconds_per_phase": party.phases,
            "execution": execution,
            "stacked_runs": stacked,
            "features": "sparse" if sparse_features else "dense",
            **peaks,
            "bytes_up": party.bytes_up,
            "bytes_down": party.bytes_down,
            "diagnostics": party.diagnostics,
            "partition_hash": data.partition.digest(),
            "data_fingerprint": data.data_fingerprint,  # not in the run key: stored keys stay valid; `import` may compare it
            "started_at": started,
            "finished_at": time.time(),
            **provenance(device),
        }
    )


def _identity(spec: RunSpec) -> dict:
    return {
        "run_key": spec.run_key,
        "config_key": spec.config_key,
        "method": spec.method,
        "protocol": spec.protocol,
        "dataset": spec.dataset,
        "scheme": spec.scheme,
        "clients": spec.clients,
        "data_seed": spec.data_seed,
        "seed": spec.seed,
        "config": spec.config(),
        "tuned_file": spec.tuned_file,
        "tuned_sha256": spec.tuned_sha256,
    }


def failed_record(spec: RunSpec, error: BaseException, device: torch.device, started: float) -> dict:
    """The record of a run that raised: kept so that tables show the cell as failed, with the reason."""
    return {
        **_identity(spec),
        "metric": dataset_spec(spec.dataset).metric,
        "status": "failed",
        "error": f"{type(error).__name__}: {error}",
        "started_at": started,
        "finished_at": time.time(),
        **provenance(device),
    }


def excluded_clients(client_curve: list[list[float]]) -> int:
    """How many clients a split's client mean leaves out: those whose value is undefined (NaN) there.
    They are the same clients in every round, as a client's nodes and labels do not change."""
    return int(np.isnan(np.array(client_curve, dtype=float)).any(axis=0).sum())


@contextlib.contextmanager
def _timed(spent: dict[str, float], phase: str, device: torch.device) -> Iterator[None]:
    """Add the wall time of the block to `spent[phase]`, CUDA synchronised at both ends."""
    _sync(device)
    tic = time.perf_counter()
    yield
    _sync(device)
    spent[phase] += time.perf_counter() - tic


class _DeviceMemory:
    """The run's peak memory, measured from the run's start.

    On CUDA: torch's peak counters are reset when the run starts, after the allocator's cached blocks are
    returned (`empty_cache`), so nothing of an earlier run in the same worker is in them. Memory held
    before the start (device graphs that `FederatedData` caches for later runs of the worker) is subtracted,
    and the run's own input graphs are added once, whether they were cached or prepared just now: the
    peak is this run's, the same for its first and its tenth run in a worker. `peak_memory_bytes` is what
    its tensors held at most (max allocated); `peak_reserved_bytes` what torch's caching allocator held
    at most (max reserved, its blocks' rounding and reserve included), which is what a process needs on
    the GPU besides its CUDA context (`sweep.packed_workers`).

    On a CPU: the process's peak resident set size, a high-water mark that also counts earlier runs of the
    same worker process (`peak_reserved_bytes` is not recorded).
    """

    def __init__(self, device: torch.device, graphs: list[Data]) -> None:
        self.device = device
        if device.type != "cuda":
            return
        self.own_graphs = _bytes_of(graphs)  # prepared now (allocated after the base) or cached (in the base)
        _sync(device)
        torch.cuda.empty_cache()
        self.allocated = torch.cuda.memory_allocated(device) - self.own_graphs
        self.reserved = torch.cuda.memory_reserved(device) - self.own_graphs
        torch.cuda.reset_peak_memory_stats(device)

    def peaks(self) -> dict[str, int]:
        if self.device.type != "cuda":
            import resource

            return {"peak_memory_bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024}  # Linux: KiB
        return {
            "peak_memory_bytes": int(torch.cuda.max_memory_allocated(self.device) - self.allocated),
            "peak_reserved_bytes": int(torch.cuda.max_memory_reserved(self.device) - self.reserved),
        }


def _bytes_of(graphs: list[Data]) -> int:
    """Bytes of the tensors the graphs hold (a CSR operator counted by its three arrays)."""
    total = 0
    for graph in graphs:
        for value in graph.to_dict().values():
            if not isinstance(value, Tensor):
                continue
            if value.layout == torch.sparse_csr:
                parts = (value.crow_indices(), value.col_indices(), value.values())
            else:
                parts = (value,)
            total += sum(part.numel() * part.element_size() for part in parts)
    return total


def _save_snapshot(state: dict, path: Path) -> None:
    """Write a server snapshot atomically; the leftovers of a writer killed before its rename are removed
    (named by host and process, as every other file gflbench writes, so a live writer's is kept)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(path.parent)
    partial = partial_path(path)
    torch.save(state, partial)
    os.replace(partial, path)


def _evaluate(clients: list, metric: Callable[[Tensor, Tensor], Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """Per-client validation and test metric of each client's deployable model, and 1.0 if all logits are
    finite (the per-client path; the batched one is `BatchedTraining.evaluate`)."""
    val, test, finite = [], [], []
    for client in clients:
        logits = client.predict()
        g = client.graph
        val.append(metric(logits[g.val_mask], g.y[g.val_mask]))
        test.append(metric(logits[g.test_mask], g.y[g.test_mask]))
        finite.append(torch.isfinite(logits).all())
    return torch.stack(val), torch.stack(test), torch.stack(finite).all().float()
