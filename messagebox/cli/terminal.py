"""How the command line shows things: aligned tables or JSON on standard output,
notes and progress on standard error.

Tables are drawn with ``rich`` on a terminal and as plain aligned columns otherwise (no
markup, no truncation, no trailing blanks: fit for ``grep`` and ``cut``). JSON is
:func:`jsonable`: datetimes as ISO 8601 strings, ids as strings, enums as their values.
Progress is shown only when standard error is a terminal, or when asked for; on a
terminal as a bar, otherwise as one line per step.

Nothing printed can drive the terminal: control and format characters in what is shown
(names an old store accepted, a service's error text) come out escaped, as ``\\x1b`` or
``\\u202e`` (:func:`escape_controls`; in JSON, as ``\\u001b`` escapes).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import sys
import unicodedata
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import IO, Any, Protocol, cast

Cell = str | int | float | None

_CONTROLS = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""Unicode categories printed escaped: control and format characters, surrogates, and
line and paragraph separators."""

_LOOK = re.compile(r"[^\x20-\x7e]")
"""What may be one of them (printable ASCII is not)."""
_JSON_LOOK = re.compile(r"[^\n\x20-\x7e]")
"""The same in JSON text, whose line breaks are its layout (in its strings, ``\\n``)."""


def escape_controls(text: str, keep: str = "") -> str:
    r"""``text`` with each control or format character but those in ``keep`` shown as
    its Python escape (``\x1b``, ``\n``, ``\u202e``)."""
    if text.isprintable():  # none of them (the common case, at C speed)
        return text

    def escape(m: re.Match[str]) -> str:
        c = m.group()
        return c if c in keep or unicodedata.category(c) not in _CONTROLS else ascii(c)[1:-1]

    return _LOOK.sub(escape, text)


def _json_escapes(text: str) -> str:
    r"""JSON text with the control and format characters in its strings (JSON escapes
    only those below U+0020) written as ``\uXXXX`` escapes: the same JSON."""
    if text.isascii() and "\x7f" not in text:
        return text

    def escape(m: re.Match[str]) -> str:
        c = m.group()
        return json.dumps(c)[1:-1] if unicodedata.category(c) in _CONTROLS else c

    return _JSON_LOOK.sub(escape, text)


def jsonable(value: object) -> Any:
    """``value`` made of JSON types only."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if hasattr(value, "model_dump"):  # a pydantic model (settings)
        return jsonable(value.model_dump())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def age(seconds: float) -> str:
    """A duration for people: ``42s``, ``3m 12s``, ``2h 5m``, ``3d 4h``."""
    s = int(seconds)
    if s < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def size(n: int) -> str:
    """Bytes for people: ``512 B``, ``1.5 KiB``, ``3.2 MiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def last_line(text: str | None, most: int = 60) -> str:
    """The last non-blank line of ``text``, cut to ``most`` characters; empty for none."""
    if not text:
        return ""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""  # a traceback's last line says what failed
    return last if len(last) <= most else last[: most - 1] + "…"


class Terminal:
    """Where a command's results go: ``json`` picks JSON over tables and text;
    ``progress`` forces progress on (True) or off (False), or leaves it to whether
    standard error is a terminal (None)."""

    def __init__(
        self,
        *,
        json_output: bool = False,
        progress: bool | None = None,
        stdout: IO[str] | None = None,
        stderr: IO[str] | None = None,
    ) -> None:
        self.json = json_output
        self.stdout: IO[str] = stdout or sys.stdout
        """Results (a served command writes them to a buffer: :mod:`messagebox.cli.remote`)."""
        self.stderr: IO[str] = stderr or sys.stderr
        self.show_progress = self.stderr.isatty() if progress is None else progress

    def binary(self) -> IO[bytes]:
        """Standard output for bytes (a message part), after the text written so far."""
        self.stdout.flush()
        return cast("IO[bytes]", self.stdout.buffer)  # type: ignore[attr-defined]

    def emit(self, data: object) -> None:
        """Print ``data`` as JSON."""
        text = json.dumps(jsonable(data), indent=2, ensure_ascii=False)
        print(_json_escapes(text), file=self.stdout)

    def say(self, text: str = "") -> None:
        """A line (or lines) of results; tabs and line breaks are kept."""
        print(escape_controls(text, keep="\n\t"), file=self.stdout)

    def note(self, text: str) -> None:
        """A remark for people, on standard error (never mixed into results)."""
        print(escape_controls(text, keep="\n\t"), file=self.stderr, flush=True)

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Cell]], empty: str) -> None:
        """Rows as aligned columns (numbers to the right); ``empty`` goes to standard
        error when there is no row, so that standard output stays empty."""
        if not rows:
            self.note(empty)
            return
        numeric = [
            all(isinstance(r[i], int | float) or r[i] is None for r in rows)
            and any(r[i] is not None for r in rows)
            for i in range(len(headers))
        ]
        text = [["" if c is None else escape_controls(str(c)) for c in r] for r in rows]
        if self.stdout.isatty():
            self._rich_table(headers, text, numeric)
            return
        widths = [max(len(h), *(len(r[i]) for r in text)) for i, h in enumerate(headers)]

        def line(cells: Sequence[str]) -> str:
            return "  ".join(
                c.rjust(w) if num else c.ljust(w)
                for c, w, num in zip(cells, widths, numeric, strict=True)
            ).rstrip()

        print(line([h.upper() for h in headers]), file=self.stdout)
        for r in text:
            print(line(r), file=self.stdout)

    def _rich_table(
        self, headers: Sequence[str], rows: list[list[str]], numeric: list[bool]
    ) -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table(box=None, pad_edge=False, header_style="bold")
        for h, num in zip(headers, numeric, strict=True):
            table.add_column(h.upper(), justify="right" if num else "left", overflow="fold")
        for r in rows:
            table.add_row(*r)
        Console(file=self.stdout, markup=False, highlight=False, emoji=False).print(table)

    def fields(self, pairs: Sequence[tuple[str, str]]) -> None:
        """``label  value`` lines, labels aligned; a multi-line value is indented."""
        width = max(len(k) for k, _ in pairs)
        for key, value in pairs:
            first, *rest = escape_controls(value, keep="\n\t").splitlines() or [""]
            print(f"{key.ljust(width)}  {first}".rstrip(), file=self.stdout)
            for more in rest:
                print(f"{' ' * width}  {more}".rstrip(), file=self.stdout)

    @contextmanager
    def progress(self, description: str) -> Iterator[Step]:
        """Report progress of a long operation (``step(done, total)``) on standard error."""
        if not self.show_progress:
            yield _quiet
            return
        if not self.stderr.isatty():
            yield _Lines(description, self.stderr)
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        ) as bar:
            task = bar.add_task(description, total=None)

            def step(done: int, total: int | None = None) -> None:
                bar.update(task, completed=done, total=total)

            yield step


class Step(Protocol):
    """Called with (done, total) as a long operation goes."""

    def __call__(self, done: int, total: int | None = None) -> None: ...


def _quiet(done: int, total: int | None = None) -> None:
    pass


class _Lines:
    def __init__(self, description: str, stream: IO[str]) -> None:
        self.description = description
        self.stream = stream

    def __call__(self, done: int, total: int | None = None) -> None:
        of = f"/{total}" if total is not None else ""
        print(f"{self.description}: {done}{of}", file=self.stream, flush=True)
