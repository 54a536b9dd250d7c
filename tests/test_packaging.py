"""The installed distribution claims one import name, `gflbench` (issue 30, "Packaging"; docs/architecture.md,
"Layout and layers"): after `pip install .`, `import cli` fails while `gflbench` works, so a user's own cli.py or
methods/ folder neither shadows ours nor is shadowed by it.

The package is installed without its dependencies into a scratch folder (they are this environment's), and
checked from a working directory of its own, where no checkout is on the path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(ROOT)],
                   check=True, capture_output=True, timeout=600)  # fmt: skip
    return target


def _python(code: str, site: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_distribution_installs_only_the_gflbench_name(installed: Path):
    names = {path.name for path in installed.iterdir() if not path.name.endswith((".dist-info", "__pycache__"))}
    assert names - {"bin"} == {"gflbench"}, names
    assert (installed / "gflbench" / "baselines" / "fedavg.py").is_file()
    assert (installed / "gflbench" / "methods" / "fedgmc.py").is_file()
    assert (installed / "gflbench" / "paper" / "paper_results.csv").is_file()  # package data travels
    assert sorted(p.name for p in (installed / "gflbench" / "experiments" / "presets").glob("*.csv"))


def test_import_cli_fails_and_gflbench_works(installed: Path, tmp_path: Path):
    assert "No module named 'cli'" in _python("import cli", installed, tmp_path).stderr
    assert "No module named 'methods'" in _python("import methods", installed, tmp_path).stderr
    listing = _python("import sys; from gflbench.commands.app import app; sys.argv[0] = 'gflbench'; app()", installed,
                      tmp_path)  # fmt: skip
    assert listing.returncode != 0  # no command: typer shows the help and exits 2
    done = _python(
        "import sys, gflbench; from gflbench.commands.app import app; sys.argv = ['gflbench', 'methods']; "
        "print(gflbench.__file__, file=sys.stderr); app()",
        installed,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert str(installed) in done.stderr  # the installed copy, not the checkout, answered
    assert "fedgmc" in done.stdout and "fedavg" in done.stdout  # the methods came through the entry points


def test_a_users_own_cli_and_methods_do_not_shadow_the_package(installed: Path, tmp_path: Path):
    (tmp_path / "cli.py").write_text("raise SystemExit('the user cli.py was imported')\n")
    (tmp_path / "methods").mkdir()
    (tmp_path / "methods" / "__init__.py").write_text("raise SystemExit('the user methods/ was imported')\n")
    done = _python("import sys; from gflbench.commands.app import app; sys.argv = ['gflbench', 'methods']; app()",
                   installed, tmp_path)  # fmt: skip
    assert done.returncode == 0 and "fedgmc" in done.stdout, done.stderr
