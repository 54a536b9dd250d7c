"""Every registered method keeps the Method contract (gfl_bench/core/method.py, gfl_bench/core/training.py) under
every executor it can run on: one round on `tiny`, with each hook the runner calls watched as it is called.

What is checked, per method and executor:
- `configure` gives every client id a message; every message is tensors only (dicts, lists, tuples);
- each client receives its own copy (no tensor of the server's), and the server aggregates copies of
  the uploads (no tensor of any client's), one per client id in ascending order;
- the bytes the record meters are the bytes that crossed, in both directions;
- `predict` gives `[N, C]` finite logits for every client, and the record has a value for every client;
- `diagnostics` gives floats; a batchable method runs batched wherever its clients train locally;
- at participation 0.5, only the sampled clients are configured, work and are aggregated, and every
  client is evaluated; a method that needs every client is refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import Tensor

from gflbench.core.method import Client, Server, all_methods
from gflbench.core.training import TrainingClient
from gflbench.errors import UserError
from gflbench.experiments.runner import run
from gflbench.experiments.spec import make_spec

CASES = [(name, False) for name in sorted(all_methods())] + [
    (name, True) for name, method in sorted(all_methods().items()) if method.batchable
]


def leaves(message: Any) -> Iterator[Any]:
    """Every leaf of a message, containers walked."""
    if isinstance(message, dict):
        for value in message.values():
            yield from leaves(value)
    elif isinstance(message, (list, tuple)):
        for value in message:
            yield from leaves(value)
    else:
        yield message


def storages(message: Any) -> set[int]:
    return {leaf.untyped_storage().data_ptr() for leaf in leaves(message) if leaf.numel() > 0}


def size(message: Any) -> int:
    return sum(leaf.numel() * leaf.element_size() for leaf in leaves(message))


def model_storages(client: Client) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in client.model.state_dict().values() if t.numel() > 0}


class Watch:
    """What the runner handed each hook and what the hook gave back, in call order."""

    def __init__(self) -> None:
        self.configured: list[dict[int, Any]] = []
        self.received: list[tuple[Client, Any]] = []  # (client, message as it arrived)
        self.uploaded: list[tuple[Client, Any]] = []  # (client, message as it left)
        self.aggregated: list[dict[int, Any]] = []
        self.diagnostics: list[dict[str, float]] = []
        self.trains_locally: list[bool] = []
        self.clients: dict[int, Client] = {}


def watch(monkeypatch: pytest.MonkeyPatch, client: type[Client], server: type[Server], batched: bool) -> Watch:
    seen = Watch()

    def wrap(owner: type, name: str, after: Any) -> None:
        original = getattr(owner, name)

        def watched(self: Any, *args: Any) -> Any:
            result = original(self, *args)
            after(self, args, result)
            return result

        monkeypatch.setattr(owner, name, watched)

    wrap(server, "configure", lambda s, args, out: seen.configured.append(out))
    wrap(server, "aggregate", lambda s, args, out: seen.aggregated.append(args[1]))
    wrap(server, "diagnostics", lambda s, args, out: seen.diagnostics.append(out))

    def arrived(c: Client, args: tuple, out: Any) -> None:
        seen.clients[c.cid] = c
        seen.received.append((c, args[1]))

    if batched:  # the batched executor calls fit's three steps itself where the clients train locally
        wrap(client, "receive", arrived)
        wrap(client, "upload", lambda c, args, out: seen.uploaded.append((c, out)))
        wrap(client, "trains_locally", lambda c, args, out: seen.trains_locally.append(out))
    if not batched or client.fit is not TrainingClient.fit:
        # per client, or a client whose own fit runs in the stages it does not train locally (FedSage+)
        def fitted(c: Client, args: tuple, out: Any) -> None:
            arrived(c, args, out)
            seen.uploaded.append((c, out))

        wrap(client, "fit", fitted)
    return seen


@pytest.mark.parametrize(("name", "batched"), CASES, ids=[f"{n}-{'batched' if b else 'per-client'}" for n, b in CASES])
def test_method_keeps_the_contract(tiny_federation, cpu, monkeypatch, name, batched):
    method = all_methods()[name]
    seen = watch(monkeypatch, method.client, method.server, batched)
    spec = make_spec(name, "tiny", "metis", 5, 0, rounds=1, local_epochs=1)
    record = run(spec, tiny_federation, cpu, batched=batched)
    clients = len(tiny_federation.graphs)
    ids = list(range(clients))

    assert record["status"] == "ok" and len(record["curves"]["val"]) == 1
    assert seen.configured and len(seen.configured) == len(seen.aggregated)
    for downloads in seen.configured:
        assert sorted(downloads) == ids, "configure must give every client id a message"
    for message in [*seen.configured, *(m for _, m in seen.received), *(m for _, m in seen.uploaded)]:
        assert all(isinstance(leaf, Tensor) for leaf in leaves(message)), "messages carry tensors only"

    sent = set().union(*(storages(downloads) for downloads in seen.configured))
    for _, message in seen.received:
        assert not storages(message) & sent, "a client received the server's own tensors, not a copy"
    assert sorted(seen.clients) == ids
    owned = set().union(*(model_storages(c) for c in seen.clients.values()))
    left = set().union(*(storages(m) for _, m in seen.uploaded))
    for uploads in seen.aggregated:
        assert list(uploads) == ids, "aggregate gets one upload per client id, in ascending order"
        assert not storages(uploads) & (owned | left), "the server aggregated a client's own tensors, not a copy"

    assert sum(record["bytes_down"]) == sum(size(downloads[cid]) for downloads in seen.configured for cid in ids)
    assert sum(record["bytes_up"]) == sum(size(message) for _, message in seen.uploaded)

    for cid, client in seen.clients.items():
        logits = client.predict()
        assert logits.shape == (client.graph.num_nodes, tiny_federation.num_classes), cid
        assert torch.isfinite(logits).all()
    assert all(len(row) == clients for row in record["client_curves"]["test"])
    assert all(isinstance(value, float) for d in seen.diagnostics for value in d.values())
    if batched:
        expected = "batched" if any(seen.trains_locally) and all(seen.trains_locally[-clients:]) else "per-client"
        assert record["execution"] == expected
    else:
        assert record["execution"] == "per-client"


@pytest.mark.parametrize("name", sorted(all_methods()))
def test_method_sees_only_the_sampled_clients(tiny_federation, cpu, monkeypatch, name):
    """At participation 0.5 (3 of tiny's 5 clients per round), over two rounds, so that a server's state of
    a client that sat a round out is used again: only the sampled clients get messages and work, the
    server aggregates only their uploads, and every client is still evaluated (docs/protocol.md,
    "Partial participation")."""
    method = all_methods()[name]
    if method.needs_every_client:  # refused before any work, with its reason
        with pytest.raises(UserError, match=f"{re.escape(name)} cannot run with --participation below 1: "):
            make_spec(name, "tiny", "metis", 5, 0, rounds=2, local_epochs=1, participation=0.5)
        return
    seen = watch(monkeypatch, method.client, method.server, batched=False)
    stages: list[int] = []
    original_stages = method.server.stages
    monkeypatch.setattr(
        method.server, "stages", lambda self, index: stages.append(original_stages(self, index)) or stages[-1]
    )
    spec = make_spec(name, "tiny", "metis", 5, 0, rounds=2, local_epochs=1, participation=0.5)
    record = run(spec, tiny_federation, cpu)
    clients = len(tiny_federation.graphs)

    assert record["status"] == "ok" and record["participation"] == 0.5
    sampled = record["participants"]
    assert len(sampled) == 2 and all(len(ids) == 3 and ids == sorted(set(ids)) for ids in sampled)
    assert sampled[0] != sampled[1], "seed 0 samples two different sets (a check that rounds are drawn apart)"
    per_exchange = [ids for ids, count in zip(sampled, stages) for _ in range(count)]
    assert len(seen.aggregated) == len(per_exchange)
    for downloads, uploads, ids in zip(seen.configured, seen.aggregated, per_exchange):
        assert set(ids) <= set(downloads), "every sampled client gets a message"
        assert list(uploads) == ids, "aggregate gets the sampled clients' uploads only, in ascending order"
    fitted = [c.cid for c, _ in seen.received]
    assert fitted == [cid for ids in per_exchange for cid in ids], "only the sampled clients work"
    assert sum(record["bytes_up"]) == sum(size(message) for _, message in seen.uploaded)
    assert all(len(row) == clients and None not in row for row in record["client_curves"]["test"])
    assert record["execution"] == "per-client"
