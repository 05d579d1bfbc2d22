"""The built distribution, as a user installs it: the wheel ``messagebox-router`` holds one
top-level package, ``messagebox`` (the repository's folders are its subpackages, with
their data files), and installs into a clean virtual environment beside another
distribution's ``adapters`` package without a clash. Building needs the package index
(for the build backend); without it the test skips, except when ``CI=true``."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.cli_support import ROOT
from tests.conftest import IN_CI

BUILD_SECONDS = 600

pytestmark = pytest.mark.xdist_group("packaging")  # one worker builds the wheel once


def run(*argv: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=BUILD_SECONDS, cwd=cwd
    )


def build_wheel(project: Path, out: Path, dist: str) -> Path:
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", out, project)
    if built.returncode != 0:
        reason = f"cannot build a wheel of {project.name}: {built.stderr[-2000:]}"
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)
    [wheel] = [w for w in out.glob("*.whl") if w.name.startswith(dist.replace("-", "_") + "-")]
    return wheel


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """This project's wheel, and a wheel of an unrelated distribution named ``adapters``
    (as the popular one on the public index) that installs a top-level ``adapters``."""
    out = tmp_path_factory.mktemp("wheels")
    other = tmp_path_factory.mktemp("other") / "adapters"
    (other / "adapters").mkdir(parents=True)
    (other / "adapters" / "__init__.py").write_text('WHO = "the other adapters"\n')
    (other / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "adapters"\nversion = "9.9"\n'
        '[tool.setuptools]\npackages = ["adapters"]\n'
    )
    # pip builds a local folder in place: build a copy, not the repository
    source = tmp_path_factory.mktemp("source") / "messagebox-router"
    shutil.copytree(
        ROOT,
        source,
        symlinks=True,
        ignore=shutil.ignore_patterns(
            ".venv", ".git", "build", "*.egg-info", "__pycache__", "*.so"
        ),  # the wheel compiles its own matcher
    )
    return build_wheel(source, out, "messagebox-router"), build_wheel(other, out, "adapters")


def test_the_wheel_holds_one_top_level_package_with_its_data(wheels: tuple[Path, Path]) -> None:
    ours, _ = wheels
    assert ours.name.startswith("messagebox_router-")
    names = zipfile.ZipFile(ours).namelist()
    top = {n.split("/")[0] for n in names}
    name, version = ours.name.split("-")[:2]  # the wheel is platform-specific: it has C
    assert top == {"messagebox", f"{name}-{version}.dist-info"}, sorted(top)
    for module in ("messagebox/predicates/_native.", "messagebox/_native."):
        compiled = [n for n in names if n.startswith(module)]  # the matcher, the UUID helpers
        assert any(n.endswith((".so", ".pyd")) for n in compiled), compiled  # built
    for needed in (
        "messagebox/predicates/__init__.py",
        "messagebox/hosts/app.py",
        "messagebox/adapters/file.py",
        "messagebox/pipelines/spark.py",
        "messagebox/sql/postgresql.sql",
        "messagebox/console/templates/base.html",
        "messagebox/console/static/console.css",
    ):
        assert needed in names, needed


def test_it_installs_beside_another_adapters_package(
    wheels: tuple[Path, Path], tmp_path: Path
) -> None:
    ours, other = wheels
    venv = tmp_path / "venv"
    made = run(sys.executable, "-m", "venv", venv)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    for wheel in (other, ours):  # the other first: ours must not overwrite it
        done = run(python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel)
        assert done.returncode == 0, done.stderr
    # the dependencies, from this environment (not the repository: it is not on the path)
    purelib = Path(sysconfig.get_paths()["purelib"])
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
                .stdout.strip())  # fmt: skip
    (site / "zz_dependencies.pth").write_text(f"{purelib}\n")
    probe = (
        "import adapters, messagebox, messagebox.adapters as ours\n"
        "from messagebox import sql\n"
        "from messagebox.predicates import P\n"
        "from messagebox.hosts import HostApp\n"
        "assert adapters.WHO == 'the other adapters'\n"
        "assert ours.receive_adapter('file:///tmp/in').__class__.__name__ == 'FileReceive'\n"
        "assert 'SELECT' in sql.load('postgresql', 'claim_instance').upper()\n"
        "print(messagebox.__file__)\n"
    )
    checked = run(python, "-I", "-c", probe, cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert str(venv) in checked.stdout  # the installed copy, not the repository's
    cli = run(venv / "bin" / "messagebox", "--help", cwd=tmp_path)
    assert cli.returncode == 0, cli.stderr
