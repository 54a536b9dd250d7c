"""Identity checks on what gflbench caches (issue 28, defects 2, 3 and 10).

A partition cache file is used only for the setting it was made for: the dataset's graph, the scheme,
the client count, the data seed and the split fractions it carries in its header are all compared with
the requested setting, and its content with its digest. A mismatching file is rebuilt, never used. A
record carries the fingerprint of the data it ran on, so stores made from two data folders can be told
apart. A bad data seed, or a data folder where the partition cache cannot be written, is one line and
exit 2 before anything is stored.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from gflbench.commands.app import app
from gflbench.data import VERBOSE_ENV, load_dataset, tiny_graph
from gflbench.data.partition import cached_partition, graph_fingerprint, make_partition
from gflbench.errors import UserError
from gflbench.experiments.spec import make_spec
from gflbench.experiments.store import RunStore

ROOT = Path(__file__).resolve().parent.parent
CODE = "import sys; from gflbench.commands.app import app; sys.argv[0] = 'gflbench'; app()"
FRACTIONS = (0.2, 0.4, 0.4)
TINY_RUN = ["run", "-m", "fedavg", "-d", "tiny", "--seeds", "1", "--rounds", "2", "--device", "cpu"]


@pytest.fixture(scope="module")
def graph():
    return tiny_graph()


def _cache_file(folder: Path, graph, scheme: str, clients: int, seed: int = 1234) -> Path:
    return folder / "tiny" / f"{scheme}-M{clients}-seed{seed}-{graph_fingerprint(graph)}.pt"


def _edited_header(source: Path, target: Path) -> None:
    """A ten-client file whose header was edited to claim the five-client setting (digest still matches)."""
    stored = torch.load(source)
    stored["identity"] = {**stored["identity"], "clients": 5}
    torch.save(stored, target)


@pytest.mark.parametrize(
    ("other", "how"),
    [
        (("metis", 10, 1234, 0), "copy"),  # the issue's probe: the M10 file over the M5 file
        (("metis", 5, 99, 0), "copy"),  # another data seed
        (("overlap", 5, 1234, 0), "copy"),  # another scheme with the same client count
        (("metis", 5, 1234, 1), "copy"),  # another graph of the same size (another dataset's file)
        (("metis", 10, 1234, 0), "edited header"),
    ],
)
def test_a_cache_file_of_another_setting_is_rebuilt_never_used(graph, tmp_path, other, how):
    scheme, clients, seed, graph_seed = other
    other_graph = tiny_graph(seed=graph_seed)
    folder = tmp_path / "partitions"
    cached_partition(other_graph, "tiny", scheme, clients, seed, FRACTIONS, folder)
    source = _cache_file(folder, other_graph, scheme, clients, seed)
    target = _cache_file(folder, graph, "metis", 5)
    if how == "copy":
        shutil.copyfile(source, target)
    else:
        _edited_header(source, target)
    expected = make_partition(graph, "metis", 5, 1234, FRACTIONS)

    got = cached_partition(graph, "tiny", "metis", 5, 1234, FRACTIONS, folder)

    assert got.num_clients == 5 and got.digest() == expected.digest()
    again = cached_partition(graph, "tiny", "metis", 5, 1234, FRACTIONS, folder)  # the rewritten file is right
    assert again.digest() == expected.digest() and target.read_bytes() != source.read_bytes()


def test_a_rebuilt_cache_file_is_said_with_verbose(graph, tmp_path, monkeypatch, capsys):
    folder = tmp_path / "partitions"
    cached_partition(graph, "tiny", "metis", 10, 1234, FRACTIONS, folder)
    target = _cache_file(folder, graph, "metis", 5)
    shutil.copyfile(_cache_file(folder, graph, "metis", 10), target)
    cached_partition(graph, "tiny", "metis", 5, 1234, FRACTIONS, folder)
    assert capsys.readouterr().err == ""  # quiet without --verbose
    shutil.copyfile(_cache_file(folder, graph, "metis", 10), target)
    monkeypatch.setenv(VERBOSE_ENV, "1")
    cached_partition(graph, "tiny", "metis", 5, 1234, FRACTIONS, folder)
    said = capsys.readouterr().err
    assert str(target) in said and "rebuilt" in said and "clients" in said


def test_a_cache_file_from_before_identities_is_rebuilt_to_the_same_partition(graph, tmp_path):
    """Files written before the header existed hold the same partition; they are rebuilt once, in place."""
    folder = tmp_path / "partitions"
    first = cached_partition(graph, "tiny", "metis", 5, 1234, FRACTIONS, folder)
    target = _cache_file(folder, graph, "metis", 5)
    stored = torch.load(target)
    torch.save({key: stored[key] for key in ("split", "client_nodes", "digest")}, target)  # the old format
    assert cached_partition(graph, "tiny", "metis", 5, 1234, FRACTIONS, folder).digest() == first.digest()
    assert "identity" in torch.load(target)


def test_leftover_partial_cache_files_of_dead_processes_are_removed(graph, tmp_path):
    folder = tmp_path / "partitions"
    cached_partition(graph, "tiny", "metis", 5, 1234, FRACTIONS, folder)
    name = _cache_file(folder, graph, "metis", 5).name
    host = socket.gethostname().replace(".", "_")
    dead_pid = 2**22 + 1  # above Linux's largest pid: no process has it
    dead = [folder / "tiny" / f"{name}.{dead_pid}.partial", folder / "tiny" / f"{name}.{host}-{dead_pid}.partial"]
    alive = folder / "tiny" / f"{name}.{host}-{os.getpid()}.partial"  # a process still writing it: kept
    elsewhere = folder / "tiny" / f"{name}.another_host-{dead_pid}.partial"  # cannot tell from here: kept
    for path in (*dead, alive, elsewhere):
        path.write_bytes(b"half a file")
    cached_partition(graph, "tiny", "metis", 10, 1234, FRACTIONS, folder)
    assert not any(path.exists() for path in dead)
    assert alive.exists() and elsewhere.exists()


def _gflbench(args: list[str], data: Path) -> None:
    """The command in a process of its own, as a user runs it (no dataset or partition kept in memory)."""
    env = {**os.environ, "GFLBENCH_DATA": str(data)}
    result = subprocess.run(
        [sys.executable, "-c", CODE, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr


def test_the_issue_probe_stores_five_clients_after_the_ten_client_file_was_copied_over(tmp_path):
    """`cp metis-M10-….pt metis-M5-….pt`, then `run --clients 5`: the record holds five clients' curves."""
    data, store, fresh = tmp_path / "data", tmp_path / "s.sqlite", tmp_path / "fresh.sqlite"
    _gflbench([*TINY_RUN, "--clients", "5,10", "--store", str(store)], data)
    (m10,) = (data / "partitions" / "tiny").glob("metis-M10-*.pt")
    (m5,) = (data / "partitions" / "tiny").glob("metis-M5-*.pt")
    shutil.copyfile(m10, m5)
    _gflbench([*TINY_RUN, "--clients", "5", "--store", str(fresh)], data)
    (before,) = [r for r in RunStore(store).records() if r["clients"] == 5]
    (after,) = RunStore(fresh).records()
    assert len(after["client_curves"]["test"][0]) == 5
    assert after["partition_hash"] == before["partition_hash"] and after["test"] == before["test"]


def test_the_record_carries_the_fingerprint_of_its_data(tmp_path):
    from gflbench.data import data_fingerprint

    store = tmp_path / "s.sqlite"
    result = CliRunner().invoke(
        app, [*TINY_RUN, "--clients", "5", "--store", str(store)], env={"GFLBENCH_DATA": str(tmp_path)}
    )
    assert result.exit_code == 0, result.output
    (record,) = RunStore(store).records()
    assert record["data_fingerprint"] == data_fingerprint(load_dataset("tiny"))
    assert data_fingerprint(tiny_graph(seed=1)) != record["data_fingerprint"]
    changed = tiny_graph()
    changed.x[0, 0] += 1.0  # one feature differs: another fingerprint, where the run key would not see it
    assert data_fingerprint(changed) != record["data_fingerprint"]


def _one_line(result, *parts: str) -> None:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    for part in parts:
        assert part in lines[0], lines[0]


@pytest.mark.parametrize("seed", ["-1", "99999999999999999999", str(2**32)])
def test_a_data_seed_out_of_range_is_one_line_and_nothing_stored(tmp_path, seed):
    store = tmp_path / "s.sqlite"
    env = {"GFLBENCH_DATA": str(tmp_path / "data")}
    runner = CliRunner()
    _one_line(
        runner.invoke(app, [*TINY_RUN, "--clients", "5", "--data-seed", seed, "--store", str(store)], env=env),
        "--data-seed",
        seed,
    )
    assert not store.exists()
    _one_line(
        runner.invoke(app, ["partitions", "-d", "tiny", "--clients", "5", "--data-seed", seed], env=env), "--data-seed"
    )
    with pytest.raises(UserError, match="data seed"):
        cached_partition(tiny_graph(), "tiny", "metis", 5, int(seed), FRACTIONS, None)


def test_the_largest_data_seed_is_accepted():
    """METIS takes a 32-bit seed: 2**32 - 1 is the last one that gives a partition of its own."""
    assert make_spec("fedavg", "tiny", "metis", 5, 0, data_seed=2**32 - 1).data_seed == 2**32 - 1


def test_a_data_folder_where_the_partition_cache_cannot_be_written_is_one_line(tmp_path):
    data, store = tmp_path / "data", tmp_path / "s.sqlite"
    data.mkdir()
    (data / "partitions").write_text("not a folder")  # unwritable even for root, as CI runs
    result = CliRunner().invoke(
        app, [*TINY_RUN, "--clients", "5", "--store", str(store)], env={"GFLBENCH_DATA": str(data)}
    )
    _one_line(result, str(data / "partitions"), "writable")
    assert not store.exists()
