"""The schemes beyond the paper (issue 32) end to end, and the run keys they must leave alone."""

from __future__ import annotations

import math

import pytest
import torch
from typer.testing import CliRunner

from gflbench.commands.app import app
from gflbench.core.method import all_methods
from gflbench.experiments.runner import DataCache, run
from gflbench.experiments.spec import make_spec, run_key_of
from gflbench.experiments.store import RunStore

NEW_SCHEMES = ("louvain", "dirichlet-0.5")
SLOW_METHODS = ("adafgl", "fedsage+", "fediih")  # 6-30 s each on tiny under a loaded runner


def test_existing_run_keys_are_unchanged():
    """The keys of the paper's schemes, written down before the new schemes existed: a change here
    would orphan every stored run."""
    assert run_key_of("0123456789abcdef0123", "cora", "metis", 10, 0) == "e6a1772d36eae7dfa239"
    assert run_key_of("0123456789abcdef0123", "citeseer", "overlap", 30, 2) == "5fe28ad0ad3442113def"
    spec = make_spec("fedavg", "cora", "metis", 10, 0)
    assert spec.scheme == "metis" and spec.run_key == run_key_of(spec.config_key, "cora", "metis", 10, 0)


def test_every_scheme_has_its_own_run_key():
    specs = [make_spec("fedavg", "cora", s, 10, 0) for s in ("metis", "louvain", "dirichlet-0.5", "dirichlet-0.1")]
    assert len({s.config_key for s in specs}) == 1  # the scheme is not configuration...
    assert len({s.run_key for s in specs}) == 4  # ...but it separates runs


@pytest.fixture(scope="module")
def cache() -> DataCache:
    return DataCache(None, None)


def _check_runs(cache: DataCache, scheme: str, methods: list[str]) -> None:
    data = cache.federated("tiny", scheme, 5, 1234)
    assert data.partition.scheme == scheme
    for method in methods:
        record = run(make_spec(method, "tiny", scheme, 5, 0, rounds=2), data, torch.device("cpu"))
        assert record["scheme"] == scheme and record["partition_hash"] == data.partition.digest()
        assert len(record["curves"]["test"]) == 2, method
        assert math.isfinite(record["test"]) and 0.25 < record["test"] <= 1.0, (method, record["test"])  # 4 classes


@pytest.mark.parametrize("scheme", NEW_SCHEMES)
def test_fast_methods_run_under_the_new_schemes(cache, scheme):
    _check_runs(cache, scheme, [m for m in all_methods() if m not in SLOW_METHODS])


@pytest.mark.slow
@pytest.mark.parametrize("scheme", NEW_SCHEMES)
def test_slow_methods_run_under_the_new_schemes(cache, scheme):
    _check_runs(cache, scheme, list(SLOW_METHODS))


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("GFLBENCH_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("GFLBENCH_RESULTS", str(tmp_path / "runs.sqlite"))
    return tmp_path


@pytest.mark.parametrize(("args", "message"), [
    (["run", "-m", "fedavg", "-d", "tiny", "--partition", "dirichlet", "--alpha", "0"], "must be a positive number"),
    (["run", "-m", "fedavg", "-d", "tiny", "--partition", "dirichlet", "--alpha", "-0.5"], "must be a positive number"),
    (["run", "-m", "fedavg", "-d", "tiny", "--partition", "dirichlet"], "needs --alpha"),
    (["run", "-m", "fedavg", "-d", "tiny", "--partition", "metis", "--alpha", "0.5"], "dirichlet scheme only"),
    (["sweep", "-m", "fedavg", "-d", "tiny", "--partition", "spectral"], "unknown partition scheme"),
    (["run", "-m", "fedavg", "-d", "tiny", "--partition", "louvain", "--clients", "400", "--rounds", "1"],
     "300 nodes are too few for 400 clients"),
    (["run", "-m", "fedavg", "-d", "tiny", "--partition", "dirichlet", "--alpha", "0.01", "--clients", "20",
      "--rounds", "1"], "larger alpha or fewer clients"),
    (["partitions", "-d", "tiny", "--partition", "dirichlet", "--alpha", "nan"], "must be a positive number"),
    (["table", "-d", "tiny", "--partition", "dirichlet"], "needs --alpha"),
])  # fmt: skip
def test_bad_schemes_are_one_line_exit_2_and_store_nothing(env, args, message):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert not (env / "runs.sqlite").exists() or len(RunStore(env / "runs.sqlite")) == 0


def test_a_louvain_table_is_a_custom_table_naming_its_scheme(env):
    runner = CliRunner()
    grid = ["-m", "fedavg", "-d", "tiny", "--clients", "5", "--seeds", "1", "--rounds", "2"]
    for scheme in (["--partition", "louvain"], ["--partition", "dirichlet", "--alpha", "0.5"]):
        assert runner.invoke(app, ["run", *grid, *scheme]).exit_code == 0
    louvain = runner.invoke(app, ["table", "-d", "tiny", "--partition", "louvain", "--rounds", "2", "--seeds", "1",
                                  "-f", "markdown"])  # fmt: skip
    assert louvain.exit_code == 0, louvain.output
    assert "tiny, louvain partitioning" in louvain.stdout and "±" in louvain.stdout
    dirichlet = runner.invoke(app, ["table", "-d", "tiny", "--partition", "dirichlet-0.5", "--rounds", "2", "--seeds",
                                    "1", "-f", "markdown"])  # fmt: skip
    assert dirichlet.exit_code == 0 and "tiny, dirichlet-0.5 partitioning" in dirichlet.stdout
    with RunStore(env / "runs.sqlite") as store:
        assert sorted(r["scheme"] for r in store.records()) == ["dirichlet-0.5", "louvain"]
