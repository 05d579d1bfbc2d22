"""Reading a stored error: where it was raised and what was raised.

A host instance stores a failed delivery's error as ``traceback.format_exception``
writes it (``hosts/failures.py``); other errors are one line (``TimeoutError: the
handler of service … did not return``, ``its subscription was removed …``).
:func:`read` takes the last traceback of the text (a chained exception's own), its
exception line, and the innermost frames of the **handler's own code**:

- the frames of messagebox itself that dispatched the delivery (``hosts/…``), of the
  standard library and of installed packages (``site-packages``, ``dist-packages``)
  are not the handler's own, unless the handler itself is in an installed package:
  then that package's frames are;
- a handler whose frames are all messagebox's (a send port's) is messagebox's own code.

A frame is its file, relative (to the handler's folder for the handler's own files, to
``site-packages`` or the standard library's folder for the others, so that the same code
deployed in two places reads the same), its function and the first line of its
statement, without its line number: an edit above it moves the line number, and would
split one failure into two; the statement's text stays until the statement itself
changes (two ``raise`` statements of one function are two sites).
"""

from __future__ import annotations

import os
import posixpath
import re
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

FRAMES = 2
"""The innermost frames of the handler's own code that say where an error was raised:
the raising statement and its caller, so that one helper failing for two callers is two
places; deeper callers would split one failure by every path into it."""
DISPATCHERS = (
    "/hosts/calls.py",
    "/hosts/orchestration_service.py",
    "/hosts/app.py",
    "/hosts/handling.py",
    "/hosts/orchestration.py",
)
"""messagebox's files that call a handler (a service, an orchestration's receive); the
last two did before a host instance was composed of parts (errors stored then)."""
HEADER = "Traceback (most recent call last):"
MAX_MESSAGE = 300

_FRAME = re.compile(
    r'^  File "(?P<file>[^"\n]*)", line \d+, in (?P<function>[^\n]*)\n(?:    (?P<code>[^\n]*)\n)?',
    re.MULTILINE,
)
_LINE = re.compile(r"([A-Za-z_][\w.]*)(?::\s?(.*))?")
_SPOKEN = re.compile(
    r"^([A-Za-z_][\w.]*(?:Error|Exception|Failure|Timeout|Exit|Interrupt|Warning|Refused)?):\s*(.*)$"
)
_INSTALLED = re.compile(r"/(?:site|dist)-packages/")
_STDLIB = re.compile(r"/lib/python\d+(?:\.\d+)?t?/|^<frozen |/Lib/")


class Frame(NamedTuple):
    """One frame of a traceback, as it identifies a place in the code."""

    file: str
    function: str
    code: str
    """The first line of the statement (empty when the source was not at hand)."""

    def __str__(self) -> str:
        return f"{self.file} in {self.function}" + (f": {self.code}" if self.code else "")


class Error(NamedTuple):
    """A stored error, read."""

    exception: str | None
    """The exception's type as printed (``ValueError``, ``httpx.ConnectTimeout``), or
    None for an error that names none."""
    message: str
    """The exception's message (its first line), or the error's last line."""
    where: tuple[Frame, ...]
    """The innermost :data:`FRAMES` frames of the handler's own code, innermost last;
    empty for an error without a traceback."""


def read(error: str | None) -> Error:
    """The exception, message and place of ``error`` (a traceback or a line)."""
    text = error or ""
    start = text.rfind(HEADER)
    start = start + len(HEADER) + 1 if start >= 0 else 0
    last = text.rfind('\n  File "', start)
    if last < 0 and not text.startswith('  File "', start):
        return _spoken(text)
    end = text.find("\n", last + 1)
    while end >= 0 and text.startswith(" ", end + 1):  # its source and caret lines
        end = text.find("\n", end + 1)
    if end < 0:  # cut short after a frame: no exception line
        return Error(None, "", _place(text[start:]))
    stop = text.find("\n", end + 1)
    first = text[end + 1 : stop if stop >= 0 else None].strip()
    found = _LINE.fullmatch(first)
    exception, message = (found.group(1), found.group(2) or "") if found else (None, first)
    return Error(exception, message[:MAX_MESSAGE], _place(text[start : end + 1]))


def _spoken(text: str) -> Error:
    """An error without a traceback: its last line, ``Type: message`` or a sentence."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    found = _SPOKEN.match(last)
    exception, message = (found.group(1), found.group(2)) if found else (None, last)
    return Error(exception, message[:MAX_MESSAGE], ())


@lru_cache(maxsize=4096)
def _place(frames: str) -> tuple[Frame, ...]:
    """The handler's innermost own frames of a traceback's frame lines (the same lines
    for every failure of one place in one version of the code: read once)."""
    found = [
        (m["file"].replace("\\", "/"), m["function"], " ".join((m["code"] or "").split()))
        for m in _FRAME.finditer(frames)
    ]
    kinds = [_kind(path) for path, _, _ in found]
    own = _own(found, kinds)
    if not own:
        return ()
    root = posixpath.dirname(found[own[0]][0])  # the handler's folder
    return tuple(
        Frame(_relative(found[i][0], kinds[i], root), found[i][1], found[i][2])
        for i in own[-FRAMES:]
    )


def _own(found: list[tuple[str, str, str]], kinds: list[str]) -> list[int]:
    """The indexes of the handler's own frames: after messagebox's dispatching frames,
    those that are neither messagebox's, nor the standard library's, nor an installed
    package's (but the handler's own package, if messagebox called it there);
    messagebox's when there are none (a send port), any when there are none of those
    either."""
    first = next((i for i, k in enumerate(kinds) if k != "messagebox"), None)
    own: list[int] = []
    if first is not None:
        package = None
        called = first > 0 and found[first - 1][0].endswith(DISPATCHERS)
        if kinds[first] == "installed" and called:  # an app installed as a package
            package = _relative(found[first][0], "installed", "").partition("/")[0] + "/"
        own = [
            i
            for i, k in enumerate(kinds)
            if k == "own"
            or (
                package is not None
                and k == "installed"
                and _relative(found[i][0], k, "").startswith(package)
            )
        ]
    return own or [i for i, k in enumerate(kinds) if k == "messagebox"] or list(range(len(found)))


def _kind(path: str) -> str:
    """Whose a frame's file is: ``messagebox``, ``installed`` (a package), ``stdlib``
    or ``own``."""
    if _ours(path):
        return "messagebox"
    if _INSTALLED.search(path):
        return "installed"
    if _STDLIB.search(path):
        return "stdlib"
    return "own"


def _relative(path: str, kind: str, root: str) -> str:
    """A frame's file: the handler's own relative to ``root``, the others to their
    package folder."""
    if kind == "messagebox":
        return "messagebox/" + path.rpartition("/messagebox/")[2]
    if kind == "installed":
        return _INSTALLED.split(path)[-1]
    if kind == "stdlib":
        return _STDLIB.split(path)[-1]
    return posixpath.relpath(path, root) if root and not path.startswith("<") else path


RETIRED = frozenset({"hosts/core.py", "hosts/handling.py", "hosts/supervision.py"})
"""messagebox's files of earlier versions (before a host instance was composed of parts):
errors stored then name them, and read as they did."""


def _ours(path: str) -> bool:
    """Whether ``path`` is one of messagebox's own files, wherever it is installed."""
    _, found, rest = path.rpartition("/messagebox/")
    return bool(found) and (rest in _package_files() or rest in RETIRED)


@lru_cache(maxsize=1)
def _package_files() -> frozenset[str]:
    """messagebox's files, relative to its package folder (the linked subpackages of a
    checkout, ``hosts/`` and the others, too)."""
    top = Path(__file__).parents[1]  # the package's folder: this module is in ops/
    return frozenset(
        (Path(folder) / name).relative_to(top).as_posix()
        for folder, _, names in os.walk(top, followlinks=True)
        for name in names
        if name.endswith(".py")
    )
