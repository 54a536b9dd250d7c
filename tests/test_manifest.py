"""Split manifests (issue 32, item 2): export, run from the file, and the files refused."""

from __future__ import annotations

import gzip
import json

import pytest
from typer.testing import CliRunner

from gflbench.commands.app import app
from gflbench.data import tiny_graph
from gflbench.data.manifest import _digest, manifest_of, manifest_partition, read_manifest, register
from gflbench.data.partition import make_partition
from gflbench.experiments.store import RunStore


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("GFLBENCH_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("GFLBENCH_RESULTS", str(tmp_path / "runs.sqlite"))
    return tmp_path


def _rewrite(path, change, rehash: bool) -> None:
    manifest = json.loads(gzip.decompress(path.read_bytes()))
    change(manifest)
    if rehash:
        manifest["sha256"] = _digest({k: v for k, v in manifest.items() if k != "sha256"})
    path.write_bytes(gzip.compress(json.dumps(manifest).encode()))


def test_a_manifest_gives_back_its_partition(tmp_path):
    graph = tiny_graph()
    for scheme, clients in (("metis", 5), ("overlap", 10), ("dirichlet-0.5", 5)):
        partition = make_partition(graph, scheme, clients, 1234, (0.2, 0.4, 0.4))
        manifest = manifest_of(partition, "tiny", graph)
        assert all(ids == sorted(ids) for c in manifest["clients"] for ids in c.values())
        label, count, seed = register(_written(manifest, tmp_path / f"{scheme}.json.gz"), "tiny", tmp_path / "cache")
        assert (label, count, seed) == ("file-" + manifest["sha256"][:16], clients, 1234)
        back = manifest_partition(graph, "tiny", label, clients, tmp_path / "cache")
        assert [n.tolist() for n in back.client_nodes] == [n.tolist() for n in partition.client_nodes]
        for nodes in partition.client_nodes:
            assert back.split[nodes].tolist() == partition.split[nodes].tolist()


def _written(manifest, path):
    from gflbench.data.manifest import write_manifest

    write_manifest(manifest, path)
    return path


def test_export_then_run_from_the_file_gives_the_schemes_curves(env):
    runner = CliRunner()
    exported = env / "tiny-metis-5.json.gz"
    result = runner.invoke(app, ["partitions", "-d", "tiny", "--clients", "5", "--export", str(exported)])
    assert result.exit_code == 0, result.output
    assert read_manifest(exported)["scheme"] == "metis"
    again = env / "again.json.gz"
    runner.invoke(app, ["partitions", "-d", "tiny", "--clients", "5", "--export", str(again)])
    assert again.read_bytes() == exported.read_bytes()  # byte-reproducible
    grid = ["run", "-m", "fedavg,fedgmc", "-d", "tiny", "--seeds", "1", "--rounds", "3"]
    assert runner.invoke(app, [*grid, "--clients", "5"]).exit_code == 0
    from_file = runner.invoke(app, [*grid, "--partition-file", str(exported)])
    assert from_file.exit_code == 0, from_file.output
    with RunStore(env / "runs.sqlite") as store:
        records = store.records()
    assert len(records) == 4
    by = {(r["method"], r["scheme"]): r for r in records}
    label = "file-" + read_manifest(exported)["sha256"][:16]
    for method in ("fedavg", "fedgmc"):
        scheme, manifest = by[(method, "metis")], by[(method, label)]
        assert scheme["run_key"] != manifest["run_key"] and scheme["config_key"] == manifest["config_key"]
        assert scheme["curves"] == manifest["curves"] and scheme["test"] == manifest["test"]


@pytest.mark.parametrize(("change", "rehash", "says"), [
    (lambda m: m["clients"][0]["train"].pop(), False, "does not match its sha256"),
    (lambda m: m.update(dataset="cora"), True, "a split of cora, not tiny"),
    (lambda m: m.update(graph="0" * 16), True, "made from another tiny graph"),
    (lambda m: m["clients"][1]["test"].append(m["clients"][0]["train"][0]), True, "a node is"),
])  # fmt: skip
def test_a_bad_manifest_is_one_line_exit_2_and_stores_nothing(env, change, rehash, says):
    runner = CliRunner()
    path = env / "split.json.gz"
    assert runner.invoke(app, ["partitions", "-d", "tiny", "--clients", "5", "--export", str(path)]).exit_code == 0
    _rewrite(path, change, rehash)
    result = runner.invoke(app, ["run", "-m", "fedavg", "-d", "tiny", "--seeds", "1", "--rounds", "2",
                                 "--partition-file", str(path)])  # fmt: skip
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0], result.stderr
    assert not (env / "runs.sqlite").exists() or len(RunStore(env / "runs.sqlite")) == 0


def test_a_manifest_is_for_one_dataset_and_its_client_count(env):
    runner = CliRunner()
    path = env / "split.json.gz"
    assert runner.invoke(app, ["partitions", "-d", "tiny", "--clients", "5", "--export", str(path)]).exit_code == 0
    for extra, says in ((["-d", "tiny,cora"], "give that dataset alone"), (["-d", "tiny", "--clients", "10"], "has 5 clients"),
                        (["-d", "cora"], "a split of tiny, not cora")):  # fmt: skip
        result = runner.invoke(app, ["run", "-m", "fedavg", *extra, "--partition-file", str(path)])
        assert result.exit_code == 2 and says in result.stderr, result.output
    not_gzip = env / "plain.json"
    not_gzip.write_text("{}")
    result = runner.invoke(app, ["run", "-m", "fedavg", "-d", "tiny", "--partition-file", str(not_gzip)])
    assert result.exit_code == 2 and "not a gzip-compressed JSON split manifest" in result.stderr


def test_a_manifest_table_and_its_refusals(env):
    runner = CliRunner()
    path = env / "split.json.gz"
    assert runner.invoke(app, ["partitions", "-d", "tiny", "--clients", "5", "--export", str(path)]).exit_code == 0
    assert runner.invoke(app, ["run", "-m", "fedavg", "-d", "tiny", "--seeds", "1", "--rounds", "2",
                               "--partition-file", str(path)]).exit_code == 0  # fmt: skip
    table = runner.invoke(app, ["table", "-d", "tiny", "--partition-file", str(path), "--rounds", "2", "--seeds", "1",
                                "-f", "markdown"])  # fmt: skip
    label = "file-" + read_manifest(path)["sha256"][:16]
    assert table.exit_code == 0, table.output
    assert f"tiny, {label} partitioning" in table.stdout and "5 Clients" in table.stdout and "±" in table.stdout
    numbered = runner.invoke(app, ["table", "1", "--partition-file", str(path)])
    assert numbered.exit_code == 2 and "custom table" in numbered.stderr
    other_seed = env / "seed7.json.gz"
    assert runner.invoke(app, ["partitions", "-d", "tiny", "--clients", "5", "--data-seed", "7", "--export",
                               str(other_seed)]).exit_code == 0  # fmt: skip
    for command in (["sweep", "-m", "fedavg", "-d", "tiny"], ["tune", "-m", "fedavg", "-d", "tiny"]):
        refused = runner.invoke(app, [*command, "--partition-file", str(other_seed)])
        assert refused.exit_code == 2 and "made at data seed 7" in refused.stderr, refused.output
