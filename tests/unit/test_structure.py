"""The code keeps its shape (tests/structure.py): module and function sizes, no driver
above the storage layer, no storage module under the hosts, one process clock, one
monotonic clock under the hosts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import structure


def test_no_module_or_function_is_too_long() -> None:
    assert structure.long_modules() == []
    assert structure.long_functions() == []


def test_nothing_above_the_storage_layer_names_a_driver_or_opens_a_transaction() -> None:
    assert structure.driver_mentions() == []
    assert structure.front_reaching_storage() == []


def test_hosts_adapters_and_pipelines_import_no_module_that_runs_sql() -> None:
    assert structure.hosts_import_sql_modules() == []


def test_only_the_clock_module_reads_the_time_of_day() -> None:
    assert structure.clock_reads() == []


def test_only_the_host_clock_reads_monotonic_time_under_the_hosts() -> None:
    assert structure.host_clock_reads() == []


def test_only_the_dialects_name_a_backend() -> None:
    assert structure.backend_names() == []


def test_the_checks_find_what_they_look_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "messagebox" / "hosts").mkdir(parents=True)
    body = "\n".join(f"    x = {n}" for n in range(structure.MAX_FUNCTION_LINES))
    (tmp_path / "messagebox" / "hosts" / "bad.py").write_text(
        f"import sqlalchemy\n\n\ndef long():\n{body}\n    return datetime.now(UTC)\n"
        + "\n" * structure.MAX_MODULE_LINES
    )
    medium = "\n" * (structure.MAX_HOST_MODULE_LINES + 1)
    (tmp_path / "messagebox" / "hosts" / "medium.py").write_text(
        medium
    )  # too long under hosts/ ...
    (tmp_path / "messagebox" / "medium.py").write_text(medium)  # ... not elsewhere
    (tmp_path / "messagebox" / "hosts" / "waits.py").write_text(
        "import time\nfrom time import sleep\n\nt = time.monotonic()\ntime.sleep(1)\n"
    )
    (tmp_path / "messagebox" / "hosts" / "timing.py").write_text(
        "import time\n\nt = time.monotonic()\n"
    )
    (tmp_path / "messagebox" / "hosts" / "imports.py").write_text(
        "from typing import TYPE_CHECKING\n\n"
        "from messagebox import allowed, storage, values\n"
        "from messagebox.storage import Thing\n"
        "from messagebox.values import Value\n\n"
        "if TYPE_CHECKING:\n    from messagebox.storage import Typed\n"
    )
    (tmp_path / "messagebox" / "storage.py").write_text("import sqlalchemy as sa\n")
    (tmp_path / "messagebox" / "allowed.py").write_text("import sqlalchemy as sa\n")
    (tmp_path / "messagebox" / "values.py").write_text("Value = int\n")
    (tmp_path / "messagebox" / "named.py").write_text(
        'if conn.dialect.name == "duckdb":\n    at = conn.execute(sa.select(sa.func.now()))\n'
    )
    monkeypatch.setattr(structure, "ROOT", tmp_path)
    monkeypatch.setattr(structure, "SQL_ALLOWED", frozenset({"messagebox.allowed"}))
    assert structure.long_modules() == [
        f"messagebox/hosts/bad.py: {structure.MAX_MODULE_LINES + 85} lines (at most "
        f"{structure.MAX_HOST_MODULE_LINES})",
        f"messagebox/hosts/medium.py: {structure.MAX_HOST_MODULE_LINES + 1} lines (at most "
        f"{structure.MAX_HOST_MODULE_LINES})",
    ]
    assert [b.split(": ")[0] for b in structure.host_clock_reads()] == [
        "messagebox/hosts/waits.py:2",
        "messagebox/hosts/waits.py:4",
        "messagebox/hosts/waits.py:5",
    ]
    assert structure.long_functions() == [
        f"messagebox/hosts/bad.py:4 long(): {structure.MAX_FUNCTION_LINES + 2} lines"
    ]
    assert [b.split(": ")[0] for b in structure.driver_mentions()] == ["messagebox/hosts/bad.py:1"]
    assert [b.split(": ")[0] for b in structure.front_reaching_storage()] == [
        "messagebox/hosts/bad.py:1"
    ]
    assert sorted(b.split(": ")[0] for b in structure.clock_reads()) == [
        f"messagebox/hosts/bad.py:{structure.MAX_FUNCTION_LINES + 5}",
        "messagebox/named.py:2",
    ]
    assert [b.split(": ")[0] for b in structure.backend_names()] == ["messagebox/named.py:1"]
    assert [b.split(": ")[0] for b in structure.hosts_import_sql_modules()] == [
        "messagebox/hosts/imports.py:3",
        "messagebox/hosts/imports.py:4",
    ]
