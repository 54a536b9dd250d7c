"""The exchange: how messages travel between a server and its clients, written once for every executor.

Per client, in client id order: the server's message is cloned and its bytes counted (down), the client
does its local work on the clone, and what it returns is cloned and counted (up). Cloning in both
directions is what lets a method share nothing but messages: a client may keep, modify or hand back
the tensors it received, and a server may send one dict to every client, without either party
aliasing the other's state; counting here is what makes every byte that crosses metered.

The per-client executor lets each client's `fit` do the local work. The batched executor
(gfl_bench/core/batched.py) splits `fit` into its three parts, `receive` for every client, one training
pass for all of them, then `upload` for every client; the cloning and counting are the same calls.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, cast

from torch import Tensor

from gflbench.core.method import Client, Message, Round
from gflbench.core.training import TrainingClient


def clone_message(message: Any) -> tuple[Any, int]:
    """A deep copy of a message (tensors cloned, detached) and its size in bytes.

    Only tensors, and dicts, lists and tuples of them, may travel: anything else is a TypeError, so a
    method cannot pass an object (a model, a graph, a generator) that would bypass the metering."""
    if isinstance(message, Tensor):
        # In the tensor's own memory layout: the batched path's first-layer weights are transposed views
        # of its stacks, and a copy in their layout is sequential (gfl_bench/core/aggregation.py:memory_order).
        return message.detach().clone(), message.numel() * message.element_size()
    if isinstance(message, dict):
        items = {k: clone_message(v) for k, v in message.items()}
        return {k: v for k, (v, _) in items.items()}, sum(n for _, n in items.values())
    if isinstance(message, (list, tuple)):
        parts = [clone_message(v) for v in message]
        return type(message)(v for v, _ in parts), sum(n for _, n in parts)
    raise TypeError(f"messages carry tensors only, got {type(message).__name__}")


@dataclass
class Exchange:
    """One run's side of one exchange: its clients, what its server sent them, and what came back.

    `context` is entered around everything a client of this run does (a run's own random streams when
    several runs are stepped together, gfl_bench/core/randomness.py). `ids` are the clients that take part,
    ascending (`--participation`, docs/protocol.md "Partial participation"); None: every client. A client
    not among them receives nothing, does nothing and uploads nothing: its state stays as it was."""

    clients: Sequence[Client]
    downloads: Mapping[int, Message]
    context: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext
    ids: Sequence[int] | None = None
    uploads: dict[int, Message] = field(default_factory=dict)
    bytes_down: int = 0
    bytes_up: int = 0

    def taking_part(self) -> list[tuple[int, Client]]:
        """(id, client) of every client that takes part in this exchange, in id order."""
        ids = range(len(self.clients)) if self.ids is None else self.ids
        return [(cid, self.clients[cid]) for cid in ids]

    def deliver(self, cid: int) -> Message:
        """Client `cid`'s copy of its download, counted."""
        if cid not in self.downloads:
            raise RuntimeError(
                f"the server's configure gave no message for client {cid}: every id it was given needs one"
            )
        message, size = clone_message(self.downloads[cid])
        self.bytes_down += size
        return message

    def collect(self, cid: int, upload: Message) -> None:
        """The server's copy of client `cid`'s upload, counted."""
        self.uploads[cid], size = clone_message(upload)
        self.bytes_up += size


def exchange(rnd: Round, runs: Sequence[Exchange], train_together: Callable[[], None] | None = None) -> None:
    """Carry one exchange for every run: each client taking part, in id order, gets its message and returns
    its upload.

    Without `train_together`, each client's `fit` does its whole local work in turn (the per-client
    executor). With it, every client only `receive`s, `train_together` trains them all at once, and
    every client then `upload`s (the batched executor: the clients are `TrainingClient`s, whose `fit`
    is exactly those three steps)."""
    if train_together is None:
        for run in runs:
            with run.context():
                for cid, client in run.taking_part():
                    run.collect(cid, client.fit(rnd, run.deliver(cid)))
        return
    for run in runs:
        with run.context():
            for cid, client in run.taking_part():
                cast(TrainingClient, client).receive(rnd, run.deliver(cid))
    train_together()
    for run in runs:
        with run.context():
            for cid, client in run.taking_part():
                run.collect(cid, cast(TrainingClient, client).upload())
