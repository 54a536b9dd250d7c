"""How a run was computed, kept apart from what it computes.

A `RunSpec` (gfl_bench/experiments/spec.py) fixes a run's numbers up to float rounding; its run key names that
experiment. How the run is computed changes only the rounding: the executor (each client alone, or every
client in one batched pass, gfl_bench/core/batched.py), seeds stacked in that pass or not (runner.run_together),
the features' layout in the first layer (dense, or a CSR copy: `--sparse-features`), the device, and on a CPU
which CPU (its vector instruction set and a digest of its model and flags, experiments/provenance.cpu_identity):
MKL and oneDNN choose kernels by the CPU, and a float-chaotic run (FedSage+, FedAvg's collapse) ends elsewhere
on another machine.
Parity tests hold each path to the per-client one (tests/test_batched.py, tests/test_stacking.py,
tests/test_backbones.py). So these settings are in no Params and in no run key: the same seed computed two
ways is the same experiment, and its spread is what `gflbench table --execution-band` shows
(docs/protocol.md, "Execution band").

The store keeps a run under its run key *and* its execution key (gfl_bench/experiments/store/): a second execution
of a stored run is a second record, never a replacement, so that the spread can be measured. Tables read
one record per run key, the first stored (`store.RunStore.frame`), so adding an execution never moves a
cell. Only the executions a record states are told apart: CPU threads are recorded (`threads`, by
execute.run_job) but not in the key, since the records before them do not say them; and a record that
predates a field reads as that field's only value then (per-client, dense, alone, CPU); a CPU record without
`cpu` (written before it was recorded) names no CPU, and its key keeps its four parts.

Not here: FedIIH's `routing_kernel` computes the same math with another rounding too, but it entered the
run key of stored runs (the sparse Minesweeper and Tolokers cells), whose keys must not change; it stays a
Params field, declared as an execution switch (`method.switch_kind`), and the band spans it as well.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

EXECUTORS = ("per-client", "batched")
FEATURE_LAYOUTS = ("dense", "sparse")


@dataclass(frozen=True)
class Execution:
    """The execution a record states: what ran, after any fallback (a method `--batched` cannot batch runs
    per client, and its record says per-client)."""

    executor: str = "per-client"
    features: str = "dense"
    stacked: bool = False  # stepped in one batched pass with other seeds of its configuration
    device: str = "cpu"  # the device type (cpu, cuda, mps): which GPU of a kind does not change the arithmetic
    cpu: str = ""  # on a CPU, which one: `<instruction set>-<digest>`; "" where the record does not say

    @property
    def key(self) -> str:
        """A readable key, e.g. `batched/sparse/stacked/cuda` or `per-client/dense/alone/cpu/avx512-1a2b3c4d`:
        tables and messages print it as it is."""
        parts = (self.executor, self.features, "stacked" if self.stacked else "alone", self.device, self.cpu)
        return "/".join(part for part in parts if part)

    @classmethod
    def of_record(cls, record: Mapping[str, Any]) -> Execution:
        """The execution a stored record states (runner's `execution`, `features`, `stacked_runs`, `device`, and
        provenance's `cpu` on a CPU)."""
        device = str(record.get("device") or cls.device).split(":")[0]
        cpu = record.get("cpu") if device == "cpu" else None
        return cls(
            executor=record.get("execution") or cls.executor,
            features=record.get("features") or cls.features,
            stacked=(record.get("stacked_runs") or 1) > 1,
            device=device,
            cpu=f"{cpu['capability']}-{cpu['digest']}" if cpu else "",
        )


DEFAULT_EXECUTION_KEY = Execution().key


def execution_key(record: Mapping[str, Any]) -> str:
    """The execution key of a record, the second half of its identity in the store."""
    return Execution.of_record(record).key


def execution_rank(key: str) -> tuple[tuple[int, ...], str]:
    """How an execution key sorts when one record of a run must be read (store tables): the reference path
    first (per-client, dense, alone, CPU: the path every parity test compares against), then the others in a
    fixed order (ties by the key's text, so a CPU run that names no CPU, stored before CPUs were recorded, comes
    before one that does: a new machine's runs never move a stored cell), so that which record a table reads never
    depends on the order runs were stored in."""
    orders = (EXECUTORS, FEATURE_LAYOUTS, ("alone", "stacked"), ("cpu",))
    parts = key.split("/")
    return tuple(known.index(v) if v in known else len(known) for v, known in zip(parts, orders, strict=False)), key
