"""Per-client numbers do not move: every registered method's two-round Cora METIS-10 client curves, on the
per-client path, are bit-identical to the committed fixture (tests/client_curves.py wrote it at a4db40b,
before the harness redesign of issue 30). Stored records are per-client, so this is what keeps them valid."""

from __future__ import annotations

import json

import pytest
import raw_formats
from client_curves import FIXTURE, client_curves

from gfl_bench.method import all_methods

MIRROR = raw_formats.real_mirror()
EXPECTED = json.loads(FIXTURE.read_text())


def test_the_fixture_covers_every_registered_method():
    assert sorted(EXPECTED) == sorted(all_methods())


@pytest.mark.slow
@pytest.mark.skipif(not (MIRROR / "Cora" / "raw").is_dir(), reason=f"no real Cora at {MIRROR}")
@pytest.mark.parametrize("method", sorted(EXPECTED))
def test_two_round_client_curves_are_bit_identical(method, tmp_path, monkeypatch):
    monkeypatch.setenv("GFLBENCH_RAW_MIRROR", str(MIRROR))
    monkeypatch.setenv("GFLBENCH_DATA", str(tmp_path / "data"))
    assert client_curves(method) == EXPECTED[method]
