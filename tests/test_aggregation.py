"""Aggregation is the weighted mean, exactly; messages are copies, and their bytes are counted."""

from __future__ import annotations

import pytest
import torch

from gflbench.backbones import GCN
from gflbench.core.aggregation import load_model_state, mixtures, model_state, weighted_mean
from gflbench.core.exchange import clone_message


def test_weighted_mean_equals_formula():
    gen = torch.Generator().manual_seed(0)
    states = [
        {
            "w": torch.randn(3, 4, dtype=torch.float64, generator=gen),
            "b": torch.randn(4, dtype=torch.float64, generator=gen),
        }
        for _ in range(5)
    ]
    weights = torch.tensor([3.0, 1.0, 0.0, 7.0, 2.0])
    mean = weighted_mean(states, weights)
    for key in ("w", "b"):
        expected = sum(w.item() * s[key] for w, s in zip(weights, states)) / weights.sum().item()
        torch.testing.assert_close(mean[key], expected, rtol=0, atol=1e-12)


def test_uploads_in_a_transposed_layout_mix_to_the_same_numbers_and_keep_their_layout():
    """The batched path's first-layer weights arrive as transposed views (gfl_bench/core/aggregation.py:memory_order)."""
    gen = torch.Generator().manual_seed(2)
    stored = [torch.randn(40, 7, generator=gen) for _ in range(5)]  # [F, h] in memory, seen as [h, F]
    views = [{"w": t.t(), "b": t[0]} for t in stored]
    copies = [{"w": t.t().contiguous(), "b": t[0].clone()} for t in stored]
    mix = torch.rand(3, 5, generator=gen, dtype=torch.float64)
    for from_views, from_copies in zip(mixtures(views, mix), mixtures(copies, mix)):
        assert torch.equal(from_views["w"], from_copies["w"]) and torch.equal(from_views["b"], from_copies["b"])
        assert from_views["w"].stride() == (1, 7) and from_copies["w"].is_contiguous()
    message, _ = clone_message(views[0])
    assert message["w"].stride() == views[0]["w"].stride()  # a copy in the sender's layout, not transposed


def test_uniform_weights_give_plain_mean():
    states = [{"w": torch.full((2,), float(i))} for i in range(4)]
    assert torch.equal(weighted_mean(states, torch.ones(4))["w"], torch.full((2,), 1.5))


def test_mixtures_apply_each_row_as_given_and_row_one_is_the_weighted_mean():
    """Row r of the mix gives Σ_m mix_rm state_m (no renormalisation); a normalised row gives to the last
    bit what `weighted_mean` gives, so a server may mix all clients at once without moving a number."""
    gen = torch.Generator().manual_seed(1)
    states = [{"w": torch.randn(6, 3, generator=gen), "b": torch.randn(3, generator=gen)} for _ in range(4)]
    mix = torch.rand(3, 4, generator=gen, dtype=torch.float64) * 2  # rows do not sum to 1
    mixed = mixtures(states, mix)
    assert len(mixed) == 3
    for r, out in enumerate(mixed):
        for key in ("w", "b"):
            expected = sum(mix[r, m].item() * states[m][key].double() for m in range(4)).float()
            torch.testing.assert_close(out[key], expected, rtol=1e-6, atol=1e-6)
            assert out[key].dtype == torch.float32
    normalised = mix / mix.sum(dim=1, keepdim=True)
    for row, out in zip(mix, mixtures(states, normalised)):
        reference = weighted_mean(states, row)
        assert all(torch.equal(out[key], reference[key]) for key in reference)


def test_model_state_excludes_head_and_loads_in_place():
    model = GCN(5, 8, 3, 0.5)
    shared = model_state(model, exclude_prefix=model.head)
    assert shared and not any(k.startswith("classifier.") for k in shared)
    param = model.conv1.lin.weight
    load_model_state(model, {k: torch.zeros_like(v) for k, v in shared.items()})
    assert model.conv1.lin.weight is param and torch.count_nonzero(param) == 0
    assert torch.count_nonzero(model.classifier.weight) > 0


def test_loading_a_state_of_another_shape_or_key_is_an_error():
    model = GCN(5, 8, 3, 0.5)
    with pytest.raises(ValueError, match=r"conv1\.lin\.weight"):  # would broadcast silently with copy_
        load_model_state(model, {"conv1.lin.weight": torch.zeros(1, 5)})
    with pytest.raises(KeyError, match="nope"):
        load_model_state(model, {"nope": torch.zeros(1)})


def test_clone_message_copies_and_counts_bytes():
    t = torch.ones(10, dtype=torch.float32)
    msg = {"a": t, "nested": [torch.zeros(3, dtype=torch.int64), {"b": torch.ones(2, 2)}]}
    copy, size = clone_message(msg)
    assert size == 10 * 4 + 3 * 8 + 4 * 4
    copy["a"][0] = 5
    assert t[0] == 1  # never aliased
