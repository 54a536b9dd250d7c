"""`gflbench report`: the site from a store of `tiny` runs, its reproducibility, its refusals, the committed
site, and the page in a real browser (Debian's chromium, headless; docs/report.md)."""

from __future__ import annotations

import gzip
import json
import re
import shlex
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gflbench.commands.app import app
from gflbench.experiments.store import RunStore
from gflbench.paper import tables
from gflbench.report import MARKER, STAMP_ENV

ROOT = Path(__file__).resolve().parent.parent
TINY = ["-d", "tiny", "--rounds", "3"]  # the runs' schedule: the report must select the same configuration
STAMP = "1700000000"


def _cli(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(app, list(args), env=env)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """Three methods on tiny METIS-5 and METIS-10, three seeds, made as a user makes them."""
    path = tmp_path_factory.mktemp("report") / "runs.sqlite"
    result = _cli("run", "-m", "fedavg,local,fedper", *TINY, "--clients", "5,10", "--seeds", "3", "--store", str(path))
    assert result.exit_code == 0, result.output
    return path


@pytest.fixture(scope="module")
def site(store, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site") / "site"
    result = _cli(
        "report", "--store", str(store), "--rounds", "3", "--seeds", "3", "--out", str(out), env={STAMP_ENV: STAMP}
    )
    assert result.exit_code == 0, result.output
    return out


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _details(html: str, cell: str) -> str:
    match = re.search(rf'<details class="provenance" id="cell-{cell}">(.*?)</details>', html, re.S)
    assert match, f"no provenance for {cell}"
    return match.group(1)


def test_the_site_shows_the_stores_cells_with_marks_provenance_and_figures(site, store):
    html = (site / "index.html").read_text()
    with RunStore(store) as runs:
        frame = runs.frame()
    sel = tables.Selection(frame, {}, rounds=3, expected_seeds=3)
    for method in ("fedavg", "local", "fedper"):
        for clients in (5, 10):
            value = sel.format(sel.cell(method, "tiny", "metis", clients))  # what `gflbench table` prints
            assert f'<a href="#cell-paper-{method}-tiny-metis-{clients}">{value}</a>' in html
            details = _details(html, f"paper-{method}-tiny-metis-{clients}")
            assert (
                f"gflbench run -m {method} -d tiny --partition metis --clients {clients} --seeds 3 --rounds 3"
                in details
            )
            assert "best client-mean validation round" in details and "right after its local training" in details
            assert "Params default" in details and "lr" in details  # every hyperparameter with its source
    assert html.count('class="best"') + html.count('class="best second"') >= 2  # a best entry in each tested column
    cd = re.search(r'<figure class="cd" id="cd-paper-other-metis"><img src="(assets/[^"]+\.svg)"', html)
    assert cd and (site / cd.group(1)).read_text().lstrip().startswith("<?xml")
    for src in re.findall(r'<img src="([^"]+)"', html):
        assert (site / src).is_file(), src
    assert "<dc:date>" not in (site / cd.group(1)).read_text()  # no date inside a figure
    grid = re.search(r'<section id="grid">.*?All \(each run once\)</td><td>(\d+)</td><td>(\d+)</td>', html, re.S)
    assert grid and int(grid.group(1)) == int(grid.group(2)) > 10000  # tiny runs are none of the paper grid's
    marker = json.loads((site / MARKER).read_text())
    assert set(marker["files"]) == set(_files(site)) - {MARKER}


def test_the_partitions_section_shows_each_partitions_heterogeneity(site):
    """One row per partition the runs trained on, with the numbers `gflbench partitions` computes for it."""
    from gflbench.data import default_data_dir
    from gflbench.data.heterogeneity import setting_summary
    from gflbench.data.partition import DEFAULT_DATA_SEED
    from gflbench.experiments.runner import DataCache

    section = re.search(r'<section id="partitions">(.*?)</section>', (site / "index.html").read_text(), re.S)
    assert section
    cache = DataCache(default_data_dir(), default_data_dir() / "partitions")
    for clients in (5, 10):
        data = cache.federated("tiny", "metis", clients, DEFAULT_DATA_SEED)
        row = setting_summary(cache.graph("tiny"), data.graphs)
        cells = "".join(
            f"<td>{row[name]:{'+.3f' if name == 'homophily_gap' else '.3f'}}</td>"
            for name in ("js", "quantity_imbalance", "homophily", "client_homophily", "homophily_gap", "missing")
        )
        expected = (
            f"<td>{clients}</td><td>{DEFAULT_DATA_SEED}</td><td><code>{data.partition.digest()}</code></td>{cells}"
        )
        assert expected in section.group(1)
    assert section.group(1).count("<tr><td>") == 2  # the two partitions, each once though three methods used it


def test_a_partition_not_remade_is_said_on_the_terminal_and_on_the_page(store, tmp_path):
    """A site whose statistics could not be recomputed (here: the stored hash is not the partition remade)
    shows the reason in its row and says it on stderr, so a rebuild without the data does not pass unnoticed."""
    exported = tmp_path / "runs.jsonl.gz"
    assert _cli("export", str(exported), "--store", str(store)).exit_code == 0
    lines = [json.loads(line) for line in gzip.decompress(exported.read_bytes()).splitlines()]
    for record in lines:
        if record["clients"] == 5:
            record["partition_hash"] = "0" * 16
    edited = tmp_path / "edited.jsonl.gz"
    edited.write_bytes(gzip.compress(b"".join(json.dumps(r, sort_keys=True).encode() + b"\n" for r in lines)))
    out = tmp_path / "site"
    result = _cli("report", "--records", str(edited), "--rounds", "3", "--seeds", "3", "--out", str(out))
    assert result.exit_code == 0, result.output
    said = [line for line in result.output.splitlines() if "not the runs'" in line]
    assert len(said) == 1 and said[0].startswith("tiny metis 5 clients: the partition remade here has hash ")
    assert "0" * 16 in (out / "index.html").read_text() and "not the runs&#39;" in (out / "index.html").read_text()


def test_same_records_give_the_same_bytes_except_the_stamp(site, store, tmp_path):
    again = tmp_path / "again"
    assert _cli("report", "--store", str(store), "--rounds", "3", "--seeds", "3", "--out", str(again),
                env={STAMP_ENV: STAMP}).exit_code == 0  # fmt: skip
    assert _files(again) == _files(site)
    later = tmp_path / "later"
    assert _cli("report", "--store", str(store), "--rounds", "3", "--seeds", "3", "--out", str(later),
                env={STAMP_ENV: "1800000000"}).exit_code == 0  # fmt: skip
    first, second = _files(site), _files(later)
    assert first.keys() == second.keys()
    differ = [name for name in first if first[name] != second[name]]
    assert sorted(differ) == [MARKER, "index.html"]
    lines = zip((site / "index.html").read_text().splitlines(), (later / "index.html").read_text().splitlines())
    changed = [(a, b) for a, b in lines if a != b]
    assert len(changed) == 1 and "built 2023-11-14" in changed[0][0] and "built 2027-01-15" in changed[0][1]


def test_a_rebuild_replaces_a_previous_report(site, store, tmp_path):
    out = tmp_path / "site"
    shutil.copytree(site, out)
    (out / "assets" / "stale.svg").write_text("old")
    marker = json.loads((out / MARKER).read_text())
    (out / MARKER).write_text(json.dumps({**marker, "files": [*marker["files"], "assets/stale.svg"]}))
    result = _cli(
        "report", "--store", str(store), "--rounds", "3", "--seeds", "3", "--out", str(out), env={STAMP_ENV: STAMP}
    )
    assert result.exit_code == 0, result.output
    assert _files(out) == _files(site)  # the stale file of the previous report is gone


def _one_line_exit_2(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_refusals_are_one_line_exit_2_and_write_nothing(store, tmp_path):
    empty = tmp_path / "empty.sqlite"
    RunStore(empty).close()
    out = tmp_path / "out"
    assert "no stored runs" in _one_line_exit_2(_cli("report", "--store", str(empty), "--out", str(out)))
    newer = tmp_path / "newer.sqlite"
    shutil.copy(store, newer)
    with sqlite3.connect(newer) as db:
        db.execute("PRAGMA user_version = 99")
    assert "newer gflbench" in _one_line_exit_2(_cli("report", "--store", str(newer), "--out", str(out)))
    line = _one_line_exit_2(_cli("report", "--store", str(store), "--protocol", "paper,fair", "--out", str(out)))
    assert "several protocols in one table" in line
    assert "--records" in _one_line_exit_2(_cli("report", "--records", "--out", str(out)))
    line = _one_line_exit_2(_cli("report", "--store", str(store), "--out", str(out)))  # the runs have 3 rounds, not 100
    assert "none of the 18 stored runs" in line and "--rounds" in line and "tiny metis-10" in line
    assert not out.exists()
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    line = _one_line_exit_2(_cli("report", "--store", str(store), "--rounds", "3", "--out", str(foreign)))
    assert "not a gflbench report" in line and "--force" in line
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    forced = _cli("report", "--store", str(store), "--rounds", "3", "--out", str(foreign), "--force")
    assert forced.exit_code == 0, forced.output
    assert (foreign / "notes.txt").read_text() == "keep me" and (foreign / "index.html").is_file()


def test_records_files_give_the_same_site_as_their_store(site, store, tmp_path):
    exported = tmp_path / "runs.jsonl.gz"
    assert _cli("export", str(exported), "--store", str(store)).exit_code == 0
    out = tmp_path / "from-records"
    result = _cli(
        "report", "--records", str(exported), "--rounds", "3", "--seeds", "3", "--out", str(out), env={STAMP_ENV: STAMP}
    )
    assert result.exit_code == 0, result.output
    ours, theirs = _files(out), _files(site)
    assert ours.keys() == theirs.keys()
    assert all(ours[name] == theirs[name] for name in ours if name.startswith("assets/"))
    assert f"--records {exported}" in ours["index.html"].decode()  # the inputs and their sha256 are listed


def test_two_cells_commands_reproduce_their_cells(site, store, tmp_path):
    html = (site / "index.html").read_text()
    with RunStore(store) as runs:
        original = {(r["method"], r["clients"], r["seed"]): r["test"] for r in runs.records()}
    for method, clients in (("fedavg", 5), ("local", 10)):
        command = re.search(
            r'<code class="command">(.*?)</code>', _details(html, f"paper-{method}-tiny-metis-{clients}")
        ).group(1)
        args = shlex.split(command.replace("&#39;", "'"))
        assert args[:2] == ["gflbench", "run"]
        fresh = tmp_path / f"{method}.sqlite"
        result = _cli(*args[1:], "--store", str(fresh))
        assert result.exit_code == 0, result.output
        with RunStore(fresh) as runs:
            again = {(r["method"], r["clients"], r["seed"]): r["test"] for r in runs.records()}
        assert again == {k: v for k, v in original.items() if k[:2] == (method, clients)}


def test_a_fedgmc_cell_shows_its_case_study_or_the_commands_that_make_it(tmp_path, monkeypatch):
    """Without snapshots the cell says what is missing and how to make it; those commands, run as shown, make
    the snapshots and the figure, and the report given their folder draws the figure in the cell."""
    monkeypatch.chdir(tmp_path)  # the commands write into results/snapshots, as a user's would
    store = tmp_path / "runs.sqlite"
    assert _cli("run", "-m", "fedgmc", *TINY, "--clients", "5", "--seeds", "1", "--store", str(store)).exit_code == 0
    plain = tmp_path / "plain"
    result = _cli(
        "report", "--store", str(store), "--rounds", "3", "--seeds", "1", "--out", str(plain), env={STAMP_ENV: STAMP}
    )
    assert result.exit_code == 0, result.output
    html = (plain / "index.html").read_text()
    details = _details(html, "paper-fedgmc-tiny-metis-5")
    assert "No case-study figure" in details and "run records do not hold" in details and "<img" not in details
    assert (
        '<a href="#cell-paper-fedgmc-tiny-metis-5">'
        in html.split('<section id="case-study">')[1].split("</section>")[0]
    )
    run_command, plot_command = (
        shlex.split(c.replace("&#39;", "'")) for c in re.findall(r'<code class="command">(.*?)</code>', details)[1:]
    )
    assert run_command[-2:] == ["--snapshot-rounds", "0,2"] and plot_command[:3] == ["gflbench", "plot", "case-study"]
    assert _cli(*run_command[1:], "--store", str(store)).exit_code == 0
    with RunStore(store) as runs:
        (key,) = [r["run_key"] for r in runs.records()]
    snapshots = tmp_path / "results" / "snapshots"
    assert sorted(p.name for p in (snapshots / key).iterdir()) == ["round0.pt", "round2.pt"]
    figure = _cli(*plot_command[1:], "--out", str(tmp_path / "case"))
    assert figure.exit_code == 0, figure.output
    assert (tmp_path / "case.png").stat().st_size > 1000
    drawn = tmp_path / "drawn"
    missing = _cli("report", "--store", str(store), "--rounds", "3", "--seeds", "1", "--out", str(drawn),
                   "--snapshots", str(tmp_path / "nowhere"), env={STAMP_ENV: STAMP})  # fmt: skip
    assert missing.exit_code == 2 and "--snapshots" in missing.output and not drawn.exists()
    result = _cli("report", "--store", str(store), "--rounds", "3", "--seeds", "1", "--out", str(drawn),
                  "--snapshots", str(snapshots), env={STAMP_ENV: STAMP})  # fmt: skip
    assert result.exit_code == 0, result.output
    details = _details((drawn / "index.html").read_text(), "paper-fedgmc-tiny-metis-5")
    src = re.search(
        r'<figure class="case-study"><img src="(assets/case-study-paper-fedgmc-tiny-metis-5\.svg)"', details
    )
    assert src and "No case-study figure" not in details
    svg = (drawn / src.group(1)).read_text()
    assert "Semantic manifolds, before refinement" in svg and "Structural manifolds, after refinement" in svg


def test_the_whole_grid_is_costed_from_the_measured_rounds(tmp_path, monkeypatch):
    """A run's seconds: its rounds × its method's round on its dataset × the method's Cora ratio of its setting;
    a method not timed on a dataset is scaled from FedAvg's round there; stand-ins and bounds are counted apart."""
    from gflbench.experiments.spec import make_spec
    from gflbench.report import grid

    csv = tmp_path / "grid_cost.csv"
    rows = [("fedavg", "cora", "metis", 10, 1.0, "measured", "real"), ("fedgmc", "cora", "metis", 10, 2.0, "measured", "real"),
            ("fedgmc", "cora", "metis", 5, 1.0, "measured", "real"), ("fedavg", "pubmed", "metis", 10, 3.0, "measured", "stand-in: x"),
            ("local", "cora", "metis", 10, 4.0, "lower bound", "real")]  # fmt: skip
    csv.write_text("method,dataset,scheme,clients,device,seconds_per_round,status,graph,machine\n"
                   + "".join(f"{m},{d},{s},{c},cpu,{t},{st},{g},here\n" for m, d, s, c, t, st, g in rows))  # fmt: skip
    monkeypatch.setattr(grid, "grid_cost_csv", lambda: csv)
    specs = [make_spec("fedgmc", "cora", "metis", 5, 0, {}), make_spec("fedgmc", "pubmed", "metis", 10, 0, {}),
             make_spec("local", "pubmed", "metis", 10, 0, {}), make_spec("fedavg", "citeseer", "metis", 10, 0, {})]  # fmt: skip
    keyed = {s.run_key: s for s in specs}
    whole = grid.whole_grid_cost({"T": keyed}, keyed)
    part = whole["rows"][0]
    # 100 rounds each: 2.0 × (1.0 / 2.0) = 1 s; 3.0 × 2.0 / 1.0 = 6 s (stand-in, scaled); 3.0 × 4.0 / 1.0 = 12 s (bound)
    assert part["runs"] == 4 and part["with_basis"] == 3 and part["bounded"] == 1
    assert (part["hours"], part["stand_in_hours"], part["scaled_hours"]) == (
        f"{1900 / 3600:.1f}",
        f"{1800 / 3600:.1f}",
        f"{1800 / 3600:.1f}",
    )
    assert whole["no_ratio"] == "none" and whole["machine"] == "here"
    local = next(r for r in whole["matrix"] if r["method"] == "Local")["cells"]
    assert local[0] == {"text": "≥4.00", "classes": "bound"}  # Cora's column


def _chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        pytest.fail("chromium is not installed, so the report cannot be checked in a browser: install Debian's "
                    "package (`apt-get install -y chromium`, as .ci/run does); nothing downloads a browser")  # fmt: skip
    return found


def _browse(chromium: str, url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0", *args, url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_page_in_a_headless_browser(site, tmp_path):
    """No console errors, the leaderboard and the CD figure present, and a cell's provenance opened from its link."""
    chromium = _chromium()
    cell = "paper-fedper-tiny-metis-10"
    shown = _browse(chromium, f"{(site / 'index.html').as_uri()}#cell-{cell}", "--dump-dom")
    assert shown.returncode == 0, shown.stderr[-2000:]
    console = [line for line in shown.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == [], console
    dom = shown.stdout
    body = re.search(r"<body([^>]*)>", dom).group(1)
    assert 'data-script="ran"' in body and 'data-figures="ok"' in body and f'data-opened="cell-{cell}"' in body
    assert re.search(r'<pre id="js-errors" hidden="">\s*</pre>', dom)  # the page's own error box stayed empty
    assert '<table class="leaderboard">' in dom and re.search(r'<figure class="cd"[^>]*><img src="assets/cd-', dom)
    assert re.search(rf'<details class="provenance target" id="cell-{cell}" open="">', dom)
    assert len(re.findall(r"<details[^>]* open=", dom)) == 1  # only the cell asked for
    shot = tmp_path / "page.png"
    taken = _browse(
        chromium, (site / "index.html").as_uri(), "--hide-scrollbars", "--window-size=1280,800", f"--screenshot={shot}"
    )
    assert taken.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_browser_check_sees_a_broken_page(site, tmp_path):
    """The check above can fail: a script error and a missing figure both show in the dumped DOM and the log."""
    chromium = _chromium()
    broken = tmp_path / "broken"
    shutil.copytree(site, broken)
    index = broken / "index.html"
    index.write_text(
        index.read_text().replace("</body>", '<script>notDefined();</script><img src="assets/gone.svg"></body>')
    )
    shown = _browse(chromium, index.as_uri(), "--dump-dom")
    assert any("Uncaught ReferenceError" in line for line in shown.stderr.splitlines())
    assert 'data-figures="missing"' in shown.stdout and "notDefined" in shown.stdout


def test_the_committed_site_is_the_report_of_the_committed_records(tmp_path, monkeypatch):
    """docs/site is exactly what README's command builds from results/records/ (the stamp read from its marker)."""
    committed = ROOT / "docs" / "site"
    stamp = json.loads((committed / MARKER).read_text())["stamp_epoch"]
    monkeypatch.chdir(ROOT)  # the page names its inputs as the command gave them: relative to the repository
    records = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "results" / "records").glob("*.jsonl.gz"))
    out = tmp_path / "site"
    result = _cli("report", "--records", *records, "--out", str(out), env={STAMP_ENV: str(stamp)})
    assert result.exit_code == 0, result.output
    built, kept = _files(out), _files(committed)
    rebuild = (f"rebuild it with the data of every dataset in the records at hand: GFLBENCH_RAW_MIRROR=../shared/data "
               f"SOURCE_DATE_EPOCH={stamp} gflbench report --records results/records/*.jsonl.gz --out docs/site")  # fmt: skip
    assert built.keys() == kept.keys(), rebuild
    assert [name for name in built if built[name] != kept[name]] == [], rebuild
