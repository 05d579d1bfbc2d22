"""What a served command may reach on the serving machine's file system.

A command served to a token holder (:mod:`messagebox.cli.remote`) reads the files the
command line sent with it, never this machine's, except a served ``spark`` command: its
input, its output and (unless sent) its subscriptions file are read and written here,
where the store is. :class:`ServedPaths` says where: inside the store's own folder (a
DuckDB store's: the database file's folder; a PostgreSQL store has none) and inside the
folders the serving process's operator allows (``MESSAGEBOX_SERVE_PATHS``, folders
separated by ``:``; none by default).

Every path is resolved before it is checked (relative to the command's working
directory, ``..`` and symbolic links followed: :func:`os.path.realpath`), and Spark is
given the resolved path, so what is checked is what is read. ``file://`` URLs are local
paths like any other; every other scheme (``hdfs://``, ``s3a://``, ``http://``…) is
refused, and so are wildcards and braces (Hadoop would expand them past the check). An
output (it is replaced) must be inside a folder, not one of the folders itself, and
neither be nor hold the store's own files (the database, its write-ahead log, its
endpoint file), which are not read either (nor a folder holding them). The files inside
a folder read are read as Spark finds them: links there are the operator's to make.
``--master`` must be local Spark and ``--conf`` one of :data:`SPARK_SETTINGS` (others
name jars, class paths and folders). What is refused raises :class:`Refused` (exit code
2), naming the option and the path.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

SERVE_PATHS_ENV = "MESSAGEBOX_SERVE_PATHS"

SPARK_SETTINGS = frozenset(
    {
        "spark.driver.memory",
        "spark.driver.maxResultSize",
        "spark.executor.memory",
        "spark.default.parallelism",
        "spark.sql.shuffle.partitions",
        "spark.sql.adaptive.enabled",
        "spark.sql.files.maxPartitionBytes",
        "spark.sql.autoBroadcastJoinThreshold",
    }
)
"""The Spark settings a served command may give (``--conf``): sizes and parallelism."""

_LOCAL_MASTER = re.compile(r"local(\[(\*|[1-9]\d*)(,[1-9]\d*)?\])?")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_WILDCARDS = frozenset("*?[]{}\\")


class Refused(Exception):
    """A served command names something it may not reach on this machine (exit 2)."""


@dataclass(frozen=True)
class ServedPaths:
    """The folders (resolved) a served command may read and write in, and the store's
    database file, which it may not touch."""

    roots: tuple[Path, ...] = ()
    database: Path | None = None

    @classmethod
    def of(cls, database: str | Path | None, allowed: Iterable[str | Path] = ()) -> ServedPaths:
        """The paths of a process serving the DuckDB file ``database`` (None: a store
        with no folder of its own), plus the folders its operator ``allowed``."""
        found = Path(os.path.realpath(database)) if database is not None else None
        roots = [found.parent] if found is not None else []
        roots += [Path(os.path.realpath(folder)) for folder in allowed]
        return cls(tuple(dict.fromkeys(roots)), found)

    def _own(self, path: Path) -> bool:
        """Whether ``path`` is one of the store's own files (``box.duckdb``,
        ``box.duckdb.wal``, ``box.duckdb.endpoint`` …)."""
        db = self.database
        return db is not None and path.parent == db.parent and path.name.startswith(db.name)

    def _outside(self, option: str, value: str, path: Path) -> Refused:
        if not self.roots:
            where = "this process serves no folder to commands (its store has none of its own)"
        else:
            where = f"outside the folders this process serves ({', '.join(map(str, self.roots))})"
        return Refused(
            f"{option} {value!r} is {path}, {where}; the serving process's operator can "
            f"allow more with {SERVE_PATHS_ENV}"
        )

    def readable(self, option: str, value: str, path: Path) -> Path:
        """``path`` (resolved) when a served command may read it."""
        if not any(path.is_relative_to(root) for root in self.roots):
            raise self._outside(option, value, path)
        db = self.database
        if self._own(path) or (db is not None and db.is_relative_to(path)):
            raise Refused(f"{option} {value!r}: the store's own files ({db}) are not served")
        return path

    def writable(self, option: str, value: str, path: Path) -> Path:
        """``path`` (resolved) when a served command may replace it."""
        if not any(path.is_relative_to(root) and path != root for root in self.roots):
            if path in self.roots:
                raise Refused(
                    f"{option} {value!r} would replace the folder {path} itself: name a "
                    "folder inside it"
                )
            raise self._outside(option, value, path)
        db = self.database
        if db is not None and (self._own(path) or db.is_relative_to(path)):
            raise Refused(
                f"{option} {value!r} would replace the store's own files ({db}): they are "
                "never written"
            )
        return path


def resolve(option: str, value: str, cwd: str | None) -> Path:
    """A local path or ``file://`` URL, resolved against ``cwd`` (the command's working
    directory); Refused for another scheme, wildcards, or a relative path without
    ``cwd``."""
    if "\x00" in value:
        raise Refused(f"{option} {value!r}: a path has no NUL character")
    scheme = _SCHEME.match(value)
    text = value
    if scheme is not None:
        parts = urlsplit(value)
        if scheme.group(1).lower() != "file" or parts.netloc not in ("", "localhost"):
            raise Refused(
                f"{option} {value!r}: a served command reads and writes local files only "
                f"(not {scheme.group(0)}); run it where that is reachable"
            )
        text = unquote(parts.path)
    found = sorted(_WILDCARDS.intersection(text))
    if found:
        raise Refused(
            f"{option} {value!r}: wildcards and braces ({' '.join(found)}) are not served; "
            "name a file or a folder"
        )
    if not os.path.isabs(text):
        if cwd is None:
            raise Refused(f"{option} {value!r}: a relative path, and no working directory")
        text = os.path.join(cwd, text)
    return Path(os.path.realpath(text))


def check_spark_settings(args: argparse.Namespace) -> None:
    """Refuse a ``--master`` other than local Spark and a ``--conf`` off
    :data:`SPARK_SETTINGS`."""
    if not _LOCAL_MASTER.fullmatch(args.master):
        raise Refused(
            f"--master {args.master!r}: a served command runs on local Spark only (local, "
            "local[N], local[*])"
        )
    for item in args.conf:
        key = item.partition("=")[0].strip()
        if key not in SPARK_SETTINGS:
            raise Refused(
                f"--conf {key}: not a Spark setting a served command may give (those: "
                f"{', '.join(sorted(SPARK_SETTINGS))})"
            )


def confine_spark(
    args: argparse.Namespace,
    paths: ServedPaths,
    cwd: str | None,
    store: Callable[[str, str, str], str],
    sent: Mapping[str, Path],
) -> None:
    """Check a served ``spark`` command's settings and paths, and give it the resolved
    paths (Refused naming the first it may not reach). ``store(option, value, cwd)``
    checks a MessageBox URL (the served store's only) and answers the URL to use;
    ``sent`` holds the files that came with the command, where they were put."""
    check_spark_settings(args)
    if args.spark_command == "route":
        args.input = str(paths.readable("--input", args.input, resolve("--input", args.input, cwd)))
    if args.output:
        where = resolve("--output", args.output, cwd)
        args.output = str(paths.writable("--output", args.output, where))
    for key in ("subscriptions", "proposed"):
        value = getattr(args, key, None)
        option = f"--{key}"
        if not value:
            continue
        if value in sent:
            setattr(args, key, str(sent[value]))
        elif "://" in value and not value.lower().startswith("file://"):
            setattr(args, key, store(option, value, cwd or ""))
        else:
            setattr(args, key, str(paths.readable(option, value, resolve(option, value, cwd))))
