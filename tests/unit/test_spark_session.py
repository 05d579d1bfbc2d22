"""What a cluster session checks before Spark starts, and the package it ships: an
unreachable or malformed master is refused at once, naming it; the shipped zip imports
in a Python that has messagebox's dependencies but not messagebox; what-if on a cluster
without a staging location is refused. No JVM is started here."""

from __future__ import annotations

import socket
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from messagebox.errors import MessageBoxError, ValidationError
from messagebox.pipelines.spark import session
from messagebox.pipelines.spark_session import SHIP_CONF, package_zip
from messagebox.pipelines.whatif import STAGING_CONF, export_messages


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_master_is_refused_at_once_naming_it() -> None:
    # Given a spark:// URL nothing answers at (Spark alone tries for a minute, then
    # fails about a stopped SparkContext)
    master = f"spark://127.0.0.1:{closed_port()}"
    # When a session is asked for
    start = time.monotonic()
    with pytest.raises(MessageBoxError, match="does not answer") as refused:
        session(master)
    # Then it is refused within seconds, naming the master
    assert time.monotonic() - start < 10
    assert master in str(refused.value)


@pytest.mark.parametrize("master", ["spark://nohost", "spark://host:port", "spark://:7077"])
def test_a_malformed_master_is_refused_naming_it(master: str) -> None:
    with pytest.raises(MessageBoxError, match="expected spark://host:port") as refused:
        session(master)
    assert repr(master) in str(refused.value)


def test_a_bad_ship_setting_is_refused() -> None:
    with pytest.raises(MessageBoxError, match=f"{SHIP_CONF} is 'true' or 'false', not 'yes'"):
        session("spark://127.0.0.1:1", **{SHIP_CONF: "yes"})


def test_the_shipped_package_imports_where_messagebox_is_not_installed(tmp_path: Path) -> None:
    # Given the zip session() ships to a cluster's executors
    shipped = package_zip(tmp_path)
    names = zipfile.ZipFile(shipped).namelist()
    assert "messagebox/pipelines/spark_publish.py" in names
    assert "messagebox/predicates/model.py" in names  # the linked folders, followed
    assert "messagebox/sql/postgresql.sql" in names
    assert not [n for n in names if n.endswith((".so", ".pyc", ".c"))]
    assert package_zip(tmp_path) == shipped  # named by its content: built once
    # When a Python with the dependencies but without messagebox puts it on its path
    # (-S: no site hooks, so no editable install), as an executor's worker does
    code = (
        "import sys; sys.path.insert(1, sys.argv[1]);"
        "from messagebox.pipelines import spark_publish;"
        "from messagebox import sql, compiled;"
        "print(spark_publish.__file__, compiled.NATIVE, len(sql.load('postgresql', 'staged')))"
    )
    env = {"PYTHONPATH": sysconfig.get_paths()["purelib"]}
    bare = subprocess.run(
        [sys.executable, "-S", "-c", "import messagebox"], cwd=tmp_path, env=env, check=False
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", code, str(shipped)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    # Then it imports messagebox from the zip, in pure Python, SQL files included
    assert bare.returncode == 1
    assert done.returncode == 0, done.stderr
    where, native, sql_length = done.stdout.split()
    assert where.startswith(str(shipped))
    assert native == "False"
    assert int(sql_length) > 0


def cluster_session(conf: dict[str, str]) -> Any:
    """What export_messages reads of a session on a cluster master."""
    return SimpleNamespace(
        conf=SimpleNamespace(get=lambda key, default=None: conf.get(key, default)),
        sparkContext=SimpleNamespace(master="spark://10.0.0.1:7077"),
    )


def test_exporting_on_a_cluster_without_a_staging_location_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"spark://10.0.0.1:7077 .*give staging="):
        export_messages(None, cluster_session({}), pages=[])


def test_the_staging_setting_gives_the_export_its_location_on_a_cluster(tmp_path: Path) -> None:
    # Given a cluster session whose settings name a shared folder to stage in
    spark = cluster_session({STAGING_CONF: str(tmp_path / "shared")})
    spark.read = SimpleNamespace(parquet=lambda path: path)
    # When the messages are exported
    read: Any = export_messages(None, spark, pages=[[("m-1", {"a.B": 1})]])
    # Then they are written, by the driver, to a new folder there
    folder = Path(read)
    assert folder.parent == tmp_path / "shared"
    assert folder.name.startswith("messagebox-export-")
    assert [p.name for p in folder.iterdir()] == ["part-00000.parquet"]
