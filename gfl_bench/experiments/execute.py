"""Executing a grid of runs: in this process, in local worker processes, or as Ray tasks.

The unit of work is a whole run (dataset × partition × clients × seed × method): client-level
parallelism costs more in communication than subgraph-FL compute (research notes, anchors §3, §5).
Workers only compute and return records; the driver alone writes the store, one atomic insert per
finished run, so killing a sweep at any moment loses only the runs in flight, and starting it again
runs exactly the missing ones. A run that raises (diverged training, out of memory, a method bug) is
stored as failed with its error and the sweep goes on; `--retry-failed` runs such cells again.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import os
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gflbench.core.method import method_class
from gflbench.data import VERBOSE_ENV
from gflbench.errors import UserError
from gflbench.experiments.runner import DataCache, check_measurable, failed_record, resolve_device, run_together
from gflbench.experiments.spec import RunSpec
from gflbench.experiments.store import RunStore

EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class Environment:
    """What a worker needs to execute a spec; plain values, so it pickles to other processes and nodes."""

    device: str = "auto"
    data_dir: Path | None = None
    threads: int = 1
    snapshot_rounds: frozenset[int] = field(default_factory=frozenset)
    snapshot_dir: Path = Path("results") / "snapshots"
    batched: bool = False  # train the clients of a `batchable` method together (gfl_bench/core/batched.py)
    sparse_features: bool = False  # first layer from a CSR copy of the features (backbones.input_layer)
    stack_seeds: int = 1  # step up to this many seeds of one batchable configuration together (runner.run_together)


_caches: dict[Path | None, DataCache] = {}  # per worker process: datasets and partitions loaded once


RoundDone = Callable[[RunSpec, int, float, float], None]


def run_job(job: list[RunSpec], env: Environment, on_round: RoundDone | None = None) -> list[dict]:
    """Run one job (a spec, or seeds stacked by `stacked_jobs`) and return its records; any failure but
    bad input becomes a failed record. A stacked job that fails is run again one spec at a time, so a
    diverging seed fails alone and the others keep their numbers (they equal the stacked ones)."""
    if not os.environ.get(VERBOSE_ENV):  # worker processes too: library warnings only with --verbose
        warnings.simplefilter("ignore")
    if env.threads:
        torch.set_num_threads(env.threads)
    device = resolve_device(env.device)
    if env.data_dir not in _caches:
        partitions = env.data_dir / "partitions" if env.data_dir else None
        _caches[env.data_dir] = DataCache(env.data_dir, partitions)
    started = time.time()
    first = job[0]
    try:
        data = _caches[env.data_dir].federated(
            first.dataset, first.scheme, first.clients, first.data_seed, first.feature_norm
        )
        check_measurable(data)  # the driver checked already, unless it has no data (Ray)
        records = run_together(job, data, device, on_round, env.snapshot_rounds, env.snapshot_dir,
                               env.batched or len(job) > 1, env.sparse_features)  # fmt: skip
        # the CPU threads the run had (not in its execution key: records before this field do not state it)
        return [{**record, "threads": torch.get_num_threads()} for record in records]
    except UserError:
        raise
    except Exception as error:
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if len(job) > 1:
            return [record for spec in job for record in run_job([spec], env, on_round)]
        return [failed_record(first, error, device, started)]


def stacked_jobs(specs: list[RunSpec], size: int) -> list[list[RunSpec]]:
    """The specs as jobs: up to `size` seeds of one batchable configuration per job, in the order of their
    first spec; every other spec alone."""
    if size <= 1:
        return [[spec] for spec in specs]
    groups: dict[tuple, list[RunSpec]] = {}
    for spec in specs:
        key = (
            spec.method,
            spec.config_key,
            spec.dataset,
            spec.scheme,
            spec.clients,
            spec.data_seed,
            spec.rounds,
            spec.local_epochs,
        )
        alone = not method_class(spec.method).batchable
        groups.setdefault((spec.run_key,) if alone else key, []).append(spec)
    jobs = []
    for group in groups.values():
        jobs.extend(group[i : i + size] for i in range(0, len(group), size))
    return jobs


def per_client_fallbacks(specs: Iterable[RunSpec]) -> list[str]:
    """The methods of these runs that `--batched` (or `--stack-seeds`) cannot batch, so that the command can
    say so instead of running them per client without a word: a method that does not declare `batchable`,
    and one whose backbone has no batched network, named as `method (backbone)`. In the order of the runs.

    Two more cases fall back per client and are known only once the data is loaded: a setting with a single
    client, and a client without training nodes (`batched.batched_trainer`)."""
    from gflbench.backbones import backbone_class
    from gflbench.backbones.base import StackedBackbone  # the backbones whose network batches

    named: dict[str, None] = {}
    for spec in specs:
        if not method_class(spec.method).batchable:
            named[spec.method] = None
        elif not issubclass(backbone_class(spec.params.backbone), StackedBackbone):
            named[f"{spec.method} ({spec.params.backbone})"] = None
    return list(named)


def pending(
    specs: Iterable[RunSpec], store: RunStore, force: bool, retry_failed: bool, rerun: frozenset[str] = frozenset()
) -> list[RunSpec]:
    """The specs this command must run: not stored yet, or stored as failed when retrying, or all with force.

    `rerun` names stored runs that must run again for an output the store does not hold (snapshots);
    the new record replaces the stored one, with the same numbers (runs are deterministic) and new timings.
    """
    status = store.statuses()
    return [
        s for s in specs
        if force or s.run_key not in status or s.run_key in rerun or (retry_failed and status[s.run_key] == "failed")
    ]  # fmt: skip


@dataclass
class Events:
    """Callbacks for progress display; all optional."""

    started: Callable[[RunSpec], None] = lambda spec: None
    round_done: Callable[[RunSpec, int, float, float], None] = lambda spec, index, val, test: None
    finished: Callable[[RunSpec, dict], None] = lambda spec, record: None
    note: Callable[[str], None] = lambda line: None  # one line for the user (the Ray tasks' GPU share)


def check_gpu_share(executor: str, device: str, gpus_per_run: float | None) -> None:
    """Refuse what would make every Ray task fail: Ray hides the GPUs from a task that reserves none,
    so `--device cuda` with `--gpus-per-run 0` cannot run anywhere."""
    if gpus_per_run is not None and gpus_per_run < 0:
        raise UserError(f"--gpus-per-run must be at least 0, got {gpus_per_run}")
    if executor == "ray" and device.startswith("cuda:"):
        raise UserError(f"--device {device} with --executor ray: each Ray task sees only the GPU it was given, as cuda; "
                        "use --device cuda")  # fmt: skip
    if executor == "ray" and device.startswith("cuda") and gpus_per_run == 0:
        raise UserError(f"--gpus-per-run 0 with --device {device}: Ray hides the GPUs from a task that reserves none; "
                        "give each run a share (e.g. 0.25) or leave the option out (default: 1/--workers)")  # fmt: skip


def ray_gpu_share(device: str, gpus_per_run: float | None, workers: int, cluster_gpus: float) -> float:
    """The GPU share each Ray task reserves.

    Given (`--gpus-per-run`), it is used as is. Otherwise a run asked for CUDA, or for `auto` on a cluster
    with GPUs, reserves 1/`workers` of a GPU (`workers` runs share one GPU, as `--workers` does locally;
    `--workers 0` or 1: a whole GPU per run), so the task sees a GPU; on a CPU cluster, or for
    `--device cpu`, none. Without a share, `auto` would silently run on the CPU inside the task.
    """
    check_gpu_share("ray", device, gpus_per_run)
    if gpus_per_run is not None:
        return gpus_per_run
    if device.startswith("cuda") or (device == "auto" and cluster_gpus > 0):
        return 1.0 / max(workers, 1)
    return 0.0


def execute(
    specs: list[RunSpec],
    store: RunStore,
    env: Environment,
    workers: int = 1,
    executor: str = "local",
    address: str | None = None,
    gpus_per_run: float | None = None,
    events: Events | None = None,
) -> None:
    """Run `specs` and store each record as it arrives (replacing any record under the same key)."""
    events = events or Events()
    if executor not in EXECUTORS:
        raise UserError(f"unknown executor {executor!r}; choose from {', '.join(EXECUTORS)}")
    jobs = stacked_jobs(specs, env.stack_seeds)
    if executor == "ray":
        _execute_ray(jobs, store, env, address, gpus_per_run, workers, events)
    elif workers <= 1:
        for job in jobs:
            for spec in job:
                events.started(spec)
            for spec, record in zip(job, run_job(job, env, events.round_done), strict=True):
                store.put(record, replace=True)
                events.finished(spec, record)
    else:
        _execute_pool(jobs, store, env, workers, events)


def _execute_pool(jobs: list[list[RunSpec]], store: RunStore, env: Environment, workers: int, events: Events) -> None:
    context = multiprocessing.get_context("spawn")  # fork would copy CUDA state and threads
    with concurrent.futures.ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=_die_with_parent
    ) as pool:
        futures = {pool.submit(run_job, job, env): job for job in jobs}
        for job in jobs[:workers]:
            for spec in job:
                events.started(spec)
        try:
            for future in concurrent.futures.as_completed(futures):
                job = futures[future]
                for spec, record in zip(job, future.result(), strict=True):
                    store.put(record, replace=True)
                    events.finished(spec, record)
        except BaseException:  # Ctrl-C, SIGTERM, a store error: end the workers now, not after their runs
            pool.shutdown(wait=False, cancel_futures=True)
            for worker in multiprocessing.active_children():
                worker.terminate()
            raise


def _die_with_parent() -> None:
    """A worker ends when its driver dies (even by kill -9), instead of computing runs no one will store.

    Linux only (prctl PR_SET_PDEATHSIG); elsewhere a worker ends after its current run, as before.
    """
    import ctypes
    import signal
    import sys

    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def _execute_ray(
    jobs: list[list[RunSpec]], store: RunStore, env: Environment, address: str | None, gpus_per_run: float | None,
    workers: int, events: Events,
) -> None:  # fmt: skip
    check_gpu_share("ray", env.device, gpus_per_run)
    try:
        import ray
    except ImportError:
        raise UserError("--executor ray needs Ray: pip install 'gflbench[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    cluster_gpus = float(ray.cluster_resources().get("GPU", 0.0))
    gpus = ray_gpu_share(env.device, gpus_per_run, workers, cluster_gpus)
    if env.device == "auto":
        where = "CUDA" if gpus > 0 else "the CPU"
        events.note(f"Ray: device auto runs on {where} ({cluster_gpus:g} GPUs in the cluster, {gpus:g} GPU per run)")
    elif gpus > 0:
        events.note(f"Ray: each run reserves {gpus:g} GPU ({cluster_gpus:g} GPUs in the cluster)")
    remote = ray.remote(num_cpus=1, num_gpus=gpus)(run_job)
    pending_refs = {remote.remote(job, env): job for job in jobs}
    try:
        while pending_refs:
            done, _ = ray.wait(list(pending_refs), num_returns=1)
            for ref in done:
                job = pending_refs.pop(ref)
                for spec, record in zip(job, ray.get(ref), strict=True):
                    store.put(record, replace=True)
                    events.finished(spec, record)
    except BaseException:
        for ref in pending_refs:
            ray.cancel(ref, force=True)
        raise
