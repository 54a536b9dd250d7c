"""The engine: a method's rounds on a federation, one or several seeds at once, and what they measured.

Protocol (docs/protocol.md): every client takes part in every round, or with `participation` F < 1
⌈F·M⌉ clients drawn per round (randomness.Participation; "Partial participation"); per round the
method's exchanges run with them (gfl_bench/core/exchange.py), then every client's own model, right after
its local training (or as it was, for a client that sat the round out), is evaluated on its local
validation and test nodes. Per round the plain client mean is kept (the
node-weighted mean too) and every client's own value. Seconds per round cover configure, local
training and aggregation, with CUDA synchronised and evaluation excluded. All data and models stay
on one device for the whole run.

This layer knows runs only as `Job`s and returns `RunResult`s; it never reads a run spec, a store or
a selection rule: the experiment layer (gfl_bench/experiments/runner.py) turns a result into the stored record.
"""

from __future__ import annotations

import contextlib
import copy
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor
from torch_geometric.data import Data

from gflbench.backbones import Backbone, build_backbone
from gflbench.core.aggregation import load_model_state
from gflbench.core.allocator import keep_freed_memory, release_excess_heap
from gflbench.core.batched import BatchedTraining, batched_trainer
from gflbench.core.exchange import Exchange, exchange
from gflbench.core.federation import FederatedData
from gflbench.core.method import Client, Method, MethodParams, Round, Server, Setup
from gflbench.core.metrics import metric_fn
from gflbench.core.randomness import (
    Participation,
    RunRandomness,
    SharedRandomness,
    nondeterministic_kernels,
    seed_everything,
)
from gflbench.core.training import TrainingClient
from gflbench.data import partial_path, remove_stale_partials
from gflbench.errors import UserError


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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _nanmean(values: Tensor, weights: Tensor | None = None) -> Tensor:
    valid = ~torch.isnan(values)
    if weights is None:
        weights = torch.ones_like(values)
    w = weights * valid
    return (torch.where(valid, values, 0.0) * w).sum() / w.sum()


@dataclass(frozen=True)
class Job:
    """One run as the engine sees it: a method's configuration, its schedule and its seed.

    `name` files the run's snapshots (`snapshot_dir/<name>/round<r>.pt`; the experiment layer gives the run key).
    `participation`: the fraction F of clients sampled per round (1: every client, nothing drawn)."""

    method: type[Method]
    params: MethodParams
    seed: int
    rounds: int
    local_epochs: int
    name: str = ""
    participation: float = 1.0


RoundCallback = Callable[[Job, int, float, float], None]  # (job, round index, client-mean val, client-mean test)


@dataclass
class RunResult:
    """What one run measured, round by round: the curves it was evaluated on and what it cost.

    Curves are per round: `curves` the client means (`val`, `test`, and the node-weighted
    `val_weighted`, `test_weighted`), `client_curves` every client's own value (`[round][client]`, NaN
    where a client has no such node). Costs are per round too: seconds (the run's share of a stacked
    round), the same split by phase, bytes each way, and the server's `diagnostics`. `participants`: the
    ids that took part in each round (every id when all did)."""

    started: float
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
    participants: list[list[int]] = field(default_factory=list)
    # The server's global (or cluster) model, scored on each client's nodes after each round's aggregation,
    # before the next local training (`Server.global_model`); empty lists for a method without one.
    global_curves: dict[str, list[float]] = field(default_factory=lambda: {"val": [], "test": []})
    global_client_curves: dict[str, list[list[float]]] = field(default_factory=lambda: {"val": [], "test": []})
    execution: str = "per-client"  # which executor trained the clients: "per-client" or "batched"
    stacked_runs: int = 1  # how many runs shared its rounds (seeds stepped together)
    features: str = "dense"  # the first layer's feature layout
    peaks: dict[str, int] = field(default_factory=dict)  # peak memory from the run's start (`_DeviceMemory`)
    nondeterministic_kernels: list[str] = field(default_factory=list)


@dataclass
class _Party:
    """One run while it is stepped: its server and clients, its random streams, and what it measures."""

    job: Job
    server: Server
    clients: list[Client]
    randomness: RunRandomness | SharedRandomness
    participation: Participation
    result: RunResult
    scorer: Backbone  # a copy of the initial model, into which the server's global model is loaded to be scored
    # each client graph's validation and test node indices, by graph (FedSage+ replaces its graphs), for the
    # global reading: indexing by a boolean mask is a host sync every round, by an index tensor it is not
    split_indices: dict[int, tuple[Data, Tensor, Tensor]] = field(default_factory=dict)


def stackable(jobs: list[Job]) -> bool:
    """Whether these runs can be stepped together: one batchable method and configuration on one
    federation, differing in the run seed only, with every client taking part (the batched pass trains
    every client; runs sampling clients are stepped per client)."""
    first = jobs[0]
    same = {(j.method, j.params, j.rounds, j.local_epochs, j.participation) for j in jobs}
    everyone = first.participation == 1
    return len(same) == 1 and len({j.seed for j in jobs}) == len(jobs) and first.method.batchable and everyone


def train(
    jobs: list[Job],
    data: FederatedData,
    device: torch.device,
    on_round: RoundCallback | None = None,
    snapshot_rounds: frozenset[int] = frozenset(),
    snapshot_dir: Path | None = None,
    batched: bool = False,
    sparse_features: bool = False,
) -> list[RunResult]:
    """Train `jobs` on `data`, one result each: one job is one run; several (one batchable configuration
    differing in the seed) are stacked along a seed axis, every client of every run in one batched pass
    per epoch (gfl_bench/core/batched.py), each run with its own server and random streams
    (gfl_bench/core/randomness.py), so each result equals the one the run gives alone, up to float summation order.

    With `batched`, a method whose clients are `batchable` has all its clients' local training done at
    once (the result's `execution` says which path ran), unless the jobs sample clients (per client then). With `sparse_features`, the backbones' first
    layer multiplies a CSR copy of the features (`backbones.input_layer`). Both change float summation
    order only. At each round in `snapshot_rounds` the server's `snapshot()` is saved under `snapshot_dir`.

    Timings: configure and aggregation are each run's own; the shared local training and evaluation
    are split evenly. Each result names the kernels without a deterministic implementation that ran.
    """
    with nondeterministic_kernels() as kernels:
        results = _train(jobs, data, device, on_round, snapshot_rounds, snapshot_dir, batched, sparse_features)
    for result in results:
        result.nondeterministic_kernels = sorted(kernels)
    return results


def _train(
    jobs: list[Job],
    data: FederatedData,
    device: torch.device,
    on_round: RoundCallback | None,
    snapshot_rounds: frozenset[int],
    snapshot_dir: Path | None,
    batched: bool,
    sparse_features: bool,
) -> list[RunResult]:
    if len(jobs) > 1 and not (batched and stackable(jobs)):
        raise ValueError("only runs of one batchable configuration differing in their seed stack, with batched=True")
    method = jobs[0].method
    if device.type == "cpu":
        keep_freed_memory()  # large tensors reused from the heap, not re-mapped (gfl_bench/core/allocator.py)
    started = time.time()
    memory = _DeviceMemory(device, data.on_device(jobs[0].params, device))  # before anything of the run is made
    parties: list[_Party] = []
    for job in jobs:
        seed_everything(job.seed, device)
        graphs = data.on_device(job.params, device)
        if sparse_features:
            for graph in graphs:  # shallow copies: the shared prepared graphs stay dense-only
                graph.x_sparse = graph.x.to_sparse_csr()
        setup = Setup(
            num_features=data.num_features,
            num_classes=data.num_classes,
            num_clients=len(graphs),
            rounds=job.rounds,
            local_epochs=job.local_epochs,
            device=device,
            seed=job.seed,
        )
        template = build_backbone(job.params, data.num_features, data.num_classes).to(device)
        server = method.server(copy.deepcopy(template), job.params, setup)
        clients = [method.client(cid, g, copy.deepcopy(template), job.params, setup) for cid, g in enumerate(graphs)]
        randomness = RunRandomness(device) if len(jobs) > 1 else SharedRandomness()
        sampler = Participation(job.participation, len(clients), job.seed)
        scorer = copy.deepcopy(template).eval()
        parties.append(_Party(job, server, clients, randomness, sampler, RunResult(started=started), scorer))
    everyone = [client for party in parties for client in party.clients]
    streams = [(party.randomness, len(party.clients)) for party in parties]
    trainer = None
    if batched and method.batchable and jobs[0].participation == 1:  # its clients are TrainingClients (`_batches`)
        trainees = [cast(TrainingClient, client) for client in everyone]
        trainer = batched_trainer(trainees, jobs[0].params.backbone)
    if trainer is None and len(jobs) > 1:
        raise ValueError(f"{method.name}'s clients cannot be batched here, so its runs cannot stack")
    together: BatchedTraining | None = None  # built at the first stage where every client trains locally
    metric = metric_fn(data.metric)
    graphs = [c.graph for c in parties[0].clients]
    val_counts = torch.tensor([float(g.val_mask.sum()) for g in graphs], device=device)
    test_counts = torch.tensor([float(g.test_mask.sum()) for g in graphs], device=device)
    share = 1.0 / len(parties)

    for index in range(jobs[0].rounds):
        _sync(device)
        tic = time.perf_counter()
        own = {id(p): dict.fromkeys(("configure", "aggregate"), 0.0) for p in parties}
        shared = {"fit": 0.0}
        traffic = {id(p): [0, 0] for p in parties}  # bytes down, up
        taking_part = {id(p): p.participation.next_round() for p in parties}  # the same ids in every stage
        for stage in range(parties[0].server.stages(index)):
            rnd = Round(index, stage)
            runs = {}
            for p in parties:
                with p.randomness.active(), _timed(own[id(p)], "configure", device):
                    ids = taking_part[id(p)]
                    runs[id(p)] = Exchange(p.clients, p.server.configure(rnd, ids), p.randomness.active, ids)
            with _timed(shared, "fit", device):
                if trainer is not None and all(c.trains_locally(rnd) for c in trainees):
                    if together is None:  # FedSage+: once its clients have mended their graphs
                        together = trainer(trainees, streams)
                    exchange(rnd, list(runs.values()), together.train_round)
                else:
                    exchange(rnd, list(runs.values()))
            for p in parties:
                traffic[id(p)][0] += runs[id(p)].bytes_down
                traffic[id(p)][1] += runs[id(p)].bytes_up
            for p in parties:
                with p.randomness.active(), _timed(own[id(p)], "aggregate", device):
                    p.server.aggregate(rnd, runs[id(p)].uploads)
        _sync(device)
        elapsed = time.perf_counter() - tic
        global_scores: dict[int, tuple[Tensor, Tensor] | None] = {}
        own_total = sum(sum(spent.values()) for spent in own.values())
        for p in parties:
            p.result.seconds.append(sum(own[id(p)].values()) + share * (elapsed - own_total))
            p.result.phases["configure"].append(own[id(p)]["configure"])
            p.result.phases["fit"].append(share * shared["fit"])
            p.result.phases["aggregate"].append(own[id(p)]["aggregate"])
            p.result.bytes_down.append(traffic[id(p)][0])
            p.result.bytes_up.append(traffic[id(p)][1])
            p.result.participants.append(taking_part[id(p)])
            for name, value in p.server.diagnostics().items():
                p.result.diagnostics.setdefault(name, []).append(float(value))
            global_scores[id(p)] = _evaluate_global(p, metric)
            if index in snapshot_rounds and snapshot_dir is not None:
                _save_snapshot(p.server.snapshot(), Path(snapshot_dir) / p.job.name / f"round{index}.pt")

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
            scored = global_scores[id(p)]
            extra = [] if scored is None else [torch.stack([_nanmean(s) for s in scored]), *scored]
            # the one host sync per run and round
            host = torch.cat([means, val, test, finite.reshape(1), *extra]).tolist()
            n = len(p.clients)
            summary, all_finite = host[:4], host[4 + 2 * n]
            p.result.client_curves["val"].append(host[4 : 4 + n])
            p.result.client_curves["test"].append(host[4 + n : 4 + 2 * n])
            if scored is not None:  # the global model's: its two means, then every client's values
                rest = host[5 + 2 * n :]
                p.result.global_curves["val"].append(rest[0])
                p.result.global_curves["test"].append(rest[1])
                p.result.global_client_curves["val"].append(rest[2 : 2 + n])
                p.result.global_client_curves["test"].append(rest[2 + n :])
            if not all_finite:
                raise RunFailed(f"non-finite predictions at round {index} (diverged training: NaN or inf)")
            for key, value in zip(p.result.curves, summary):
                p.result.curves[key].append(value)
            if on_round is not None:
                on_round(p.job, index, summary[0], summary[1])
        for p in parties:
            p.result.phases["evaluate"].append(share * (time.perf_counter() - evaluated))  # the host syncs above end it
        if device.type == "cpu":
            release_excess_heap()  # the kept heap's freed memory stays bounded across rounds (gfl_bench/core/allocator.py)
    peaks = memory.peaks()
    for p in parties:
        p.result.execution = "batched" if together is not None else "per-client"
        p.result.stacked_runs = len(parties)
        p.result.features = "sparse" if sparse_features else "dense"
        p.result.peaks = peaks
    return [p.result for p in parties]


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
            parts = (
                [value.crow_indices(), value.col_indices(), value.values()]
                if value.layout == torch.sparse_csr
                else [value]
            )
            total += sum(part.numel() * part.element_size() for part in parts)
    return total


def _save_snapshot(state: dict[str, Any], path: Path) -> None:
    """Write a server snapshot atomically; the leftovers of a writer killed before its rename are removed
    (named by host and process, as every other file gflbench writes, so a live writer's is kept)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(path.parent)
    partial = partial_path(path)
    torch.save(state, partial)
    os.replace(partial, path)


@torch.no_grad()
def _evaluate_global(party: _Party, metric: Callable[[Tensor, Tensor], Tensor]) -> tuple[Tensor, Tensor] | None:
    """Per-client validation and test metric of the model each client would start its next round from, if the
    method has a global or cluster one (`Server.global_model`); None if it has not. Eval mode, no random draw,
    so the run's other numbers are what they are without it."""
    server, scorer = party.server, party.scorer
    val, test = [], []
    for client in party.clients:
        weights = server.global_model(client.cid)
        if weights is None:
            return None
        missing = set(scorer.state_dict()) - set(weights)
        if missing:
            raise RuntimeError(
                f"{type(server).__name__}.global_model lacks {sorted(missing)}: it must be a whole model"
            )
        load_model_state(scorer, weights)
        g = client.graph
        known = party.split_indices.get(id(g))
        if known is None or known[0] is not g:
            known = party.split_indices[id(g)] = (g, g.val_mask.nonzero().view(-1), g.test_mask.nonzero().view(-1))
        _, val_index, test_index = known
        logits = scorer(g)
        val.append(metric(logits[val_index], g.y[val_index]))
        test.append(metric(logits[test_index], g.y[test_index]))
    return torch.stack(val), torch.stack(test)


def _evaluate(clients: list[Any], metric: Callable[[Tensor, Tensor], Tensor]) -> tuple[Tensor, Tensor, Tensor]:
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
