"""Model-state helpers shared by every method that sends weights: copy out, load in, average."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn


def model_state(model: nn.Module, exclude_prefix: str | None = None) -> dict[str, Tensor]:
    """The model's parameters and buffers by name, detached, optionally without one sub-module."""
    return {
        name: value.detach()
        for name, value in model.state_dict().items()
        if exclude_prefix is None or not name.startswith(exclude_prefix + ".")
    }


def load_model_state(model: nn.Module, state: dict[str, Tensor]) -> None:
    """Copy `state` into the model in place (optimiser state keeps pointing at the same tensors).

    A direct copy into the named parameters and buffers: `load_state_dict`'s key matching per call,
    every client's every round, was a noticeable share of a batched round (docs/results.md,
    "Measurements behind design choices")."""
    targets: dict[str, Tensor] = dict(model.named_parameters())
    targets.update(model.named_buffers())
    unexpected = state.keys() - targets.keys()
    if unexpected:
        raise KeyError(f"state has keys the model lacks: {sorted(unexpected)}")
    with torch.no_grad():
        for name, value in state.items():
            target = targets[name]
            if target.shape != value.shape:
                raise ValueError(f"{name}: state has shape {tuple(value.shape)}, the model {tuple(target.shape)}")
            target.copy_(value)


def weighted_mean(states: Sequence[dict[str, Tensor]], weights: Tensor) -> dict[str, Tensor]:
    """sum_i w_i * state_i / sum_i w_i, key by key."""
    w = weights.to(dtype=torch.float64)
    return mixtures(states, (w / w.sum())[None])[0]


def mixtures(states: Sequence[dict[str, Tensor]], mix: Tensor) -> list[dict[str, Tensor]]:
    """[Σ_m mix_rm · state_m for every row r of `mix`], key by key, with the rows as given (not renormalised).

    One float64 product per key (in cache-sized blocks on a CPU) gives all R mixtures: a personalising server (FED-PUB, FedGTA) that
    mixed row by row would stack and widen every upload R times, which on Cora-10 made FED-PUB's
    aggregation a tenth of its round and its peak memory 130 MB above FedAvg's.
    """
    if not states:
        raise ValueError("nothing to average")
    mix = mix.to(dtype=torch.float64)
    mixed: list[dict[str, Tensor]] = [{} for _ in range(mix.shape[0])]
    for key in states[0]:
        order = memory_order(states[0][key])
        shape = states[0][key].permute(order).shape
        parts = [s[key].permute(order).reshape(-1) for s in states]  # flat views where the layouts agree
        rows = _mix_flat(parts, mix.to(parts[0].device)).view(mix.shape[0], *shape)  # [R, *shape] in memory order
        inverse = [order.index(axis) for axis in range(len(order))]
        for out, row in zip(mixed, rows.unbind(0)):
            out[key] = row.permute(inverse)
    return mixed


# Elements per upload in one pass of `_mix_flat` on a CPU: the [M, chunk] float64 block then stays in
# cache between the stack and the product (same numbers, about half the time per key: docs/results.md,
# "Measurements behind design choices"); a GPU takes each key in one pass.
MIX_CHUNK = 8192


def _mix_flat(parts: list[Tensor], mix: Tensor) -> Tensor:
    """mix [R, M] (float64) × the M flat uploads, widened to float64 while stacking. [R, P] in their dtype"""
    size = parts[0].numel()
    chunk = MIX_CHUNK if parts[0].device.type == "cpu" else max(size, 1)
    out = torch.empty((mix.shape[0], size), dtype=parts[0].dtype, device=parts[0].device)
    block = torch.empty(len(parts) * min(chunk, size), dtype=torch.float64, device=parts[0].device)
    for start in range(0, size, chunk):
        stop = min(start + chunk, size)
        wide = block[: len(parts) * (stop - start)].view(len(parts), stop - start)
        torch.stack([part[start:stop] for part in parts], out=wide)
        out[:, start:stop] = mix @ wide
    return out


def memory_order(tensor: Tensor) -> list[int]:
    """The axes of `tensor` from the slowest-varying in memory to the fastest: `tensor.permute(order)` is
    contiguous when `tensor` is a permuted contiguous tensor.

    The batched path (gfl_bench/core/batched.py) keeps first-layer weights input-major, so its clients
    upload transposed views; stacking them in their own memory order, and handing the mixture back in
    that order, turns the stack, the clients' loads and the next uploads into sequential copies (the
    element-wise arithmetic is unchanged: the same numbers). Ties (size-1 axes) keep their order.
    Stacked in logical order instead, Cora METIS-20's FedAvg of those uploads and the loads back take
    twice as long (`python bench/first_layer_layout.py`: 54 vs 111 ms)."""
    strides = tensor.stride()
    return sorted(range(tensor.dim()), key=lambda axis: -strides[axis])


# Upload key each client weighting reads ("uniform" reads none): training nodes (McMahan's FedAvg) or all nodes.
WEIGHTING_KEYS = {"train": "num_train", "nodes": "num_nodes"}


def client_weights(uploads: Mapping[int, dict[str, Tensor]], weighting: str) -> Tensor:
    """One weight per upload for `weighted_mean`: 1 each ("uniform"), or the count `WEIGHTING_KEYS` names (≥ 1)."""
    if weighting == "uniform":
        return torch.ones(len(uploads))
    return torch.stack([u[WEIGHTING_KEYS[weighting]] for u in uploads.values()]).float().clamp(min=1)
