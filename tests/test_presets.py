"""The `paper` preset data files (gfl_bench/experiments/presets/*.csv) and the one helper that reads them."""

from __future__ import annotations

import shutil

import pytest
from typer.testing import CliRunner

from gflbench.baselines.fedici import FedICI
from gflbench.baselines.fedssa import FEDICI_BACKBONE_FIELDS, FedSSA
from gflbench.baselines.fedtad import FedTAD
from gflbench.commands.app import app
from gflbench.core.method import all_methods
from gflbench.data import DATASETS
from gflbench.data.partition import SCHEMES
from gflbench.errors import UserError
from gflbench.experiments import presets
from gflbench.experiments.protocol import write_tuned
from gflbench.experiments.spec import make_spec, parse_overrides

HEADER = "dataset,scheme,clients,key,value,source\n"
SETTINGS = [(d, s, c) for d in DATASETS for s, counts in SCHEMES.items() for c in counts]


def declared() -> dict[str, type]:
    """Every registered method that declares a preset file, by file name."""
    return {m.paper_preset_file: m for m in all_methods().values() if m.paper_preset_file is not None}


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A copy of the shipped preset folder that a test may break; the helper reads it instead."""
    copy = tmp_path / "presets"
    shutil.copytree(presets.PRESET_DIR, copy)
    monkeypatch.setattr(presets, "PRESET_DIR", copy)
    return copy


def test_every_shipped_file_is_declared_by_one_method_and_every_declared_file_ships():
    files = {path.name for path in presets.PRESET_DIR.glob("*.csv")}
    owners = declared()
    assert files == set(owners)
    assert {"fedici.csv", "fediih.csv", "fedpub.csv", "fedtad.csv", "fedgta.csv", "adafgl.csv"} <= files


@pytest.mark.parametrize("file", sorted(declared()))
def test_every_value_has_a_source_and_is_a_valid_setting(file):
    rows = presets.read_preset(declared()[file], file)
    assert rows
    for row in rows:
        assert row.source.strip() and row.value.strip(), row
    assert len({(r.dataset, r.scheme, r.clients, r.key) for r in rows}) == len(rows)
    # every setting resolves into a configuration the method accepts
    for dataset, scheme, clients in SETTINGS:
        make_spec(declared()[file].name, dataset, scheme, clients, 0)


def test_fedici_reads_its_config_blocks_and_the_code_readings():
    cora = presets.paper_preset(FedICI, "cora", "metis", 10)
    assert {k: cora[k] for k in ("levels", "hidden", "lr", "weight_decay", "graph_rule", "backbone")} == {
        "levels": "7", "hidden": "512", "lr": "0.15", "weight_decay": "0.0005", "graph_rule": "code", "backbone": "unifilter-code",
    }  # fmt: skip
    rows = presets.read_preset(FedICI, "fedici.csv")
    (row,) = [r for r in rows if (r.dataset, r.scheme, r.clients, r.key) == ("cora", "metis", 10, "hidden")]
    assert row.source == "blgpb/FedGSP@fb62d3b core/config.py:88"
    photo = make_spec("fedici", "amazon-photo", "overlap", 30, 0)
    assert (photo.rounds, photo.local_epochs) == (200, 2)  # the config's comm_round / n_eps, equal to the protocol's


def test_the_row_that_names_a_setting_most_closely_wins(folder):
    (folder / "fedtad.csv").write_text(
        "# a comment line\n" + HEADER
        + "*,*,*,hidden,64,everywhere\n"
        + "cora,*,*,hidden,32,a dataset\n"
        + "cora,*,10,hidden,8,a dataset and a client count\n"
        + "cora,metis,*,hidden,16,a dataset and a scheme\n"
        + "*,overlap,*,local_epochs,2,a scheme\n"
    )  # fmt: skip
    assert presets.paper_preset(FedTAD, "citeseer", "metis", 10) == {"hidden": "64"}
    assert presets.paper_preset(FedTAD, "cora", "metis", 10) == {"hidden": "16"}  # the scheme outranks the client count
    assert presets.paper_preset(FedTAD, "cora", "overlap", 10) == {"hidden": "8", "local_epochs": "2"}
    assert presets.paper_preset(FedTAD, "cora", "overlap", 30) == {"hidden": "32", "local_epochs": "2"}


def test_fedssa_takes_fedicis_values_from_fedicis_file(folder):
    for setting in SETTINGS:
        fedici = presets.paper_preset(FedICI, *setting)
        assert presets.paper_preset(FedSSA, *setting) == {k: fedici[k] for k in FEDICI_BACKBONE_FIELDS if k in fedici}
    assert presets.paper_preset(FedSSA, "cora", "metis", 10)["hidden"] == "512"
    # no copy of the table: a value changed in FedICI's file is FedSSA's value
    text = (folder / "fedici.csv").read_text()
    (folder / "fedici.csv").write_text(text.replace("cora,metis,10,hidden,512,", "cora,metis,10,hidden,1024,"))
    assert presets.paper_preset(FedSSA, "cora", "metis", 10)["hidden"] == "1024"


def test_set_switches_fedicis_graph_rule_alone():
    overrides = parse_overrides(["fedici.graph_rule=paper"], ["fedici"])["fedici"]
    params = make_spec("fedici", "cora", "metis", 10, 0, overrides).params
    assert (params.graph_rule, params.backbone) == ("paper", "unifilter-code")


def test_the_schedule_is_the_papers_only_under_paper(tmp_path):
    for method in ("fedgta", "fedtad", "adafgl"):
        spec = make_spec(method, "amazon-computer", "metis", 10, 0)
        assert (spec.local_epochs, spec.rounds, spec.params.hidden, spec.params.weight_decay) == (3, 100, 64, 5e-4)
        assert make_spec(method, "tiny", "metis", 5, 0).params.hidden == 128  # no row: the shared values
    write_tuned(tmp_path, "pubmed", "metis", 10, "fedtad", {"values": {"lr": 0.02}})
    fair = make_spec("fedtad", "pubmed", "metis", 10, 0, protocol="fair", tuned=tmp_path)
    assert (fair.local_epochs, fair.rounds, fair.params.lr, fair.params.hidden) == (1, 100, 0.02, 64)
    trial = make_spec("fedtad", "pubmed", "metis", 10, 0, shared_schedule=True)  # what `gflbench tune` runs
    assert trial.local_epochs == 1 and trial.params == make_spec("fedtad", "pubmed", "metis", 10, 0).params
    assert make_spec("fedtad", "pubmed", "metis", 10, 0, local_epochs=2, rounds=7).local_epochs == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "has no header"),
        ("dataset,scheme,clients,key,value\n*,*,*,hidden,64\n", "the header must be"),
        ("dataset,scheme,clients,key,value,source,note\n", "the header must be"),  # an unknown field
        (HEADER + "*,*,*,hidden,64\n", "line 2: 5 fields, expected 6"),
        (HEADER + "*,*,*,hidden,64,\n", "line 2: the source field is empty"),
        (HEADER + "*,*,*,hidden,64,x,y\n", "line 2: 7 fields"),
        (HEADER + "*,*,*,width,64,src\n", "fedtad has no parameter 'width'"),
        (HEADER + "*,*,*,hidden,sixty-four,src\n", "fedtad.hidden expects int, got 'sixty-four'"),
        (HEADER + "*,*,*,weight_decay,-1,src\n", "fedtad.weight_decay=-1.0 is out of range"),
        (HEADER + "*,*,*,topology,spiral,src\n", "topology must be one of"),
        (HEADER + "*,*,*,backbone,resnet,src\n", "resnet"),
        (HEADER + "*,*,*,local_epochs,1.5,src\n", "local_epochs must be a whole number"),
        (HEADER + "*,*,*,rounds,0,src\n", "rounds must be at least 1"),
        (HEADER + "*,*,*,feature_norm,l2,src\n", "feature_norm must be one of row, none, got 'l2'"),
        (HEADER + "corra,*,*,hidden,64,src\n", "unknown dataset 'corra'"),
        (HEADER + "cora,louvain,*,hidden,64,src\n", "unknown partition scheme 'louvain'"),
        (HEADER + "cora,overlap,12,hidden,64,src\n", "line 2: the overlap scheme makes clients in groups of 5"),
        (
            HEADER + "cora,*,*,hidden,64,a\ncora,*,*,hidden,32,b\n",
            "line 3: hidden is set for this setting on line 2 too",
        ),
    ],
)
def test_a_malformed_file_is_one_error_naming_the_file_and_the_line(folder, content, message):
    (folder / "fedtad.csv").write_text(content)
    with pytest.raises(UserError, match=r"fedtad\.csv") as error:
        make_spec("fedtad", "cora", "metis", 10, 0)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_missing_file_is_an_error_not_an_empty_preset(folder):
    (folder / "fedici.csv").unlink()
    for method in ("fedici", "fedssa"):  # FedSSA reads FedICI's file
        with pytest.raises(UserError, match=r"fedici\.csv of fedici is missing"):
            make_spec(method, "tiny", "metis", 5, 0)


@pytest.mark.parametrize("breakage", ["missing", "malformed"])
def test_the_command_line_exits_2_and_stores_nothing(folder, tmp_path, monkeypatch, breakage):
    monkeypatch.setenv("GFLBENCH_DATA", str(tmp_path / "data"))
    store = tmp_path / "runs.sqlite"
    if breakage == "missing":
        (folder / "fedtad.csv").unlink()
    else:
        (folder / "fedtad.csv").write_text(HEADER + "*,*,*,hidden,64,\n")
    result = CliRunner().invoke(
        app,
        [
            "run",
            "-m",
            "fedavg,fedtad",
            "-d",
            "tiny",
            "--clients",
            "5",
            "--rounds",
            "2",
            "--seeds",
            "1",
            "--store",
            str(store),
        ],
    )
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "fedtad.csv" in lines[0], result.stderr
    assert not store.exists()  # FedAvg's run, valid on its own, is not stored either: nothing starts
