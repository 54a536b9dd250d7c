"""End to end on real data: `gflbench run` on Cora for a few rounds, then `gflbench table 1`."""

from __future__ import annotations

import pytest
import raw_formats
from typer.testing import CliRunner

from gflbench.commands.app import app
from gflbench.experiments.store import RunStore

MIRROR = raw_formats.real_mirror()


@pytest.mark.slow
@pytest.mark.skipif(not (MIRROR / "Cora" / "raw").is_dir(), reason=f"no real Cora at {MIRROR}")
def test_real_cora_few_rounds(tmp_path, monkeypatch):
    monkeypatch.setenv("GFLBENCH_RAW_MIRROR", str(MIRROR))
    monkeypatch.setenv("GFLBENCH_DATA", str(tmp_path / "data"))
    store = tmp_path / "runs.sqlite"
    args = ["run", "-m", "local,fedavg,fedprox,fedper", "-d", "cora", "--clients", "5", "--seeds", "1",
            "--rounds", "4", "--store", str(store), "--device", "cpu"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    with RunStore(store) as s:
        records = s.records()
    assert len(records) == 4
    for record in records:
        assert record["metric"] == "accuracy" and record["clients"] == 5
        assert 0.3 < record["test"] <= 1.0  # four rounds already beat chance (1/7) by far
        assert len(record["curves"]["test"]) == 4 and record["best_round"] < 4
    partition_hashes = {r["partition_hash"] for r in records}
    assert len(partition_hashes) == 1  # every method saw the same partition

    table = CliRunner().invoke(
        app, ["table", "1", "--rounds", "4", "--store", str(store), "-f", "markdown", "--seeds", "1"]
    )
    assert table.exit_code == 0, table.output
    assert "| FedPer" in table.stdout and "±" in table.stdout
