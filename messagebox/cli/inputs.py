"""Command-line inputs, checked before anything is done: subscription references,
``@FILE`` arguments, typed properties, filters, ages and suspended-queue filters.
Malformed input raises :class:`UsageError` (exit code 2) naming the option.

Files and standard input are read here: from this machine, or, for a command a running
process serves (:mod:`messagebox.cli.remote`), from what the command line sent with it
(:data:`SENT`)."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import sys
import uuid
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from messagebox.errors import FilterValidationError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from messagebox.cli.terminal import Terminal
    from messagebox.engine import MessageBox
    from messagebox.predicates import Filter
    from messagebox.properties import Value


class UsageError(Exception):
    """The command line is malformed (exit code 2); nothing was done."""


@dataclass(frozen=True)
class Sent:
    """The files (by the name the command line gives) and standard input that came with
    a command served by another process."""

    files: dict[str, bytes] = field(default_factory=dict)
    stdin: bytes = b""


SENT: ContextVar[Sent | None] = ContextVar("messagebox_cli_sent", default=None)
"""Set while a served command runs: its inputs come from here, not from this machine."""


def check_file(name: str) -> None:
    """A usage error unless ``name`` is a readable file."""
    sent = SENT.get()
    if sent is not None:
        if name not in sent.files:
            raise UsageError(f"no file {name!r}")
        return
    path = Path(name)
    if not path.exists():
        raise UsageError(f"no file {name!r}")
    if not path.is_file():
        raise UsageError(f"{name!r} is not a file")
    if not os.access(path, os.R_OK):
        raise UsageError(f"cannot read {name!r}")


def open_file(name: str) -> IO[bytes]:
    """A file to read as bytes."""
    sent = SENT.get()
    if sent is not None:
        return io.BytesIO(sent.files[name])
    return open(name, "rb")


def stdin_bytes(out: Terminal) -> bytes:
    """All of standard input."""
    sent = SENT.get()
    if sent is not None:
        return sent.stdin
    if sys.stdin.isatty():
        out.note("reading the message body from standard input (end it with Ctrl-D)")
    return sys.stdin.buffer.read()


def ref(text: str) -> int | str:
    """A subscription reference: digits are an id, anything else a name."""
    return int(text) if text.isdigit() else text


def message_id(text: str) -> uuid.UUID:
    """A message id (a UUID)."""
    try:
        return uuid.UUID(text)
    except ValueError:
        raise UsageError(f"{text!r} is not a message id (a UUID)") from None


def read_arg(text: str, what: str) -> str:
    """``text``, or the contents of a file when it is ``@FILE``: a regular file of at
    most :data:`~messagebox.config.routing_file.MAX_FILE_BYTES` of UTF-8 text (anything else
    is a usage error naming the file)."""
    from messagebox.config.routing_file import MAX_FILE_BYTES, RoutingFileError, decode, read

    if not text.startswith("@"):
        return text
    name = text[1:]
    try:
        sent = SENT.get()
        if sent is None:
            return read(name, what)
        if name not in sent.files:
            raise UsageError(f"{what}: cannot read {name!r}: no file {name!r} was sent")
        if len(sent.files[name]) > MAX_FILE_BYTES:
            raise UsageError(
                f"{what} {name!r} is larger than {MAX_FILE_BYTES // 2**20} MiB, the most "
                "that is read"
            )
        return decode(sent.files[name], name, what)
    except RoutingFileError as exc:
        raise UsageError(str(exc)) from None


def assignments(items: Sequence[str], option: str) -> dict[str, Value]:
    from messagebox.properties import parse_assignment

    out: dict[str, Value] = {}
    for item in items:
        try:
            name, value = parse_assignment(item)
        except ValueError as exc:
            raise UsageError(f"{option} {item!r}: {exc}") from exc
        if name in out:
            raise UsageError(f"{option}: property {name!r} is given twice")
        out[name] = value
    return out


def properties(args: argparse.Namespace) -> dict[str, Value]:
    """Promoted properties from --properties-json, then -p (a name given by both is an error)."""
    from messagebox.properties import properties_from_json

    found: dict[str, Value] = {}
    if args.properties_json is not None:
        text = read_arg(args.properties_json, "--properties-json")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--properties-json is not JSON: {exc}") from exc
        except RecursionError:
            raise UsageError(
                "--properties-json: arrays or objects are nested too deeply to read"
            ) from None
        try:
            found.update(properties_from_json(data))
        except ValueError as exc:
            raise UsageError(f"--properties-json: {exc}") from exc
    for name, value in assignments(args.properties, "--property").items():
        if name in found:
            raise UsageError(f"property {name!r} is given by --properties-json and --property")
        found[name] = value
    return found


def inferred(items: Sequence[str]) -> dict[str, str]:
    """The ``-p`` properties given without a type (``name=value``), by canonical name,
    with the text of their value: their type was guessed from it."""
    from messagebox.properties import canonical_name

    out: dict[str, str] = {}
    for item in items:
        left, _, raw = item.partition("=")
        if ":" not in left:
            out[canonical_name(left.strip())] = raw
    return out


def filter_arg(text: str) -> Filter:
    from messagebox.predicates import Filter, parse_filter

    source = read_arg(text, "--filter")
    try:
        if source.lstrip().startswith("{"):
            return Filter.from_json(source)
        return parse_filter(source)
    except FilterValidationError as exc:
        raise UsageError(f"--filter: {exc}") from exc
    except RecursionError:
        raise UsageError("--filter: the filter's JSON is nested too deeply to read") from None


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(w|d|h|m|s)")
_UNIT_SECONDS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}


def duration(text: str, option: str = "--older-than") -> timedelta:
    """``90s``, ``15m``, ``2h``, ``7d``, ``1h30m``, or a number of seconds."""
    compact = text.strip().lower().replace(" ", "")
    if re.fullmatch(r"\d+(?:\.\d+)?", compact):
        compact += "s"
    parts = _DURATION.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise UsageError(f"{option} {text!r}: expected an age such as 90s, 15m, 2h, 7d, 1h30m")
    try:
        return timedelta(seconds=sum(float(n) * _UNIT_SECONDS[u] for n, u in parts))
    except OverflowError:
        raise UsageError(f"{option} {text!r}: too long") from None


def ago(text: str, option: str, now: datetime) -> datetime:
    """The time ``text`` (an age, as :func:`duration` reads it) before ``now`` (the
    database's, so that an operator's clock does not move the cut-off)."""
    try:
        return now - duration(text, option)
    except OverflowError:
        raise UsageError(f"{option} {text!r}: further back than the year 1") from None


def known_host(box: MessageBox, name: str | None) -> str | None:
    """``--host`` checked: an unknown host is an error (exit 3), not an empty answer."""
    from messagebox.errors import UnknownHost
    from messagebox.suggest import did_you_mean

    if name is None:
        return None
    hosts = {h.name for h in box.hosts()}
    if name not in hosts:
        raise UnknownHost(
            f"--host: no host named {name!r}{did_you_mean(name, hosts)} (`messagebox hosts "
            "list` shows them, `messagebox hosts add` creates one)"
        )
    return name


def suspended_query(box: MessageBox, args: argparse.Namespace) -> dict[str, Any]:
    """The suspended-queue filters given, checked: a host, service or subscription that
    does not exist is an error (a typo would otherwise match nothing, silently)."""
    from messagebox.errors import UnknownSubscription
    from messagebox.models import SUSPENDED_REASONS

    query: dict[str, Any] = {}
    if args.reason is not None:
        if args.reason not in SUSPENDED_REASONS and not box.suspended(reason=args.reason, limit=1):
            raise UsageError(
                f"--reason {args.reason!r}: no entry has it; the reasons are "
                + ", ".join(SUSPENDED_REASONS)
            )
        query["reason"] = args.reason
    if args.host is not None:
        query["host"] = known_host(box, args.host)
    if args.service is not None:
        if not box.subscriptions(service=args.service):
            raise UnknownSubscription(f"--service: service {args.service!r} has no subscription")
        query["service"] = args.service
    if args.subscription is not None:
        sub = ref(args.subscription)
        # an id is taken as it is: a removed subscription's entries keep its id
        query["subscription"] = sub if isinstance(sub, int) else box.subscription(sub).id
    if args.older_than is not None:
        query["before"] = ago(args.older_than, "--older-than", box.now())
    if args.error is not None:
        if not args.error:
            raise UsageError("--error: give the text the errors contain")
        query["error"] = args.error
    if args.group is not None:
        if not re.fullmatch(r"[0-9a-f]{16}", args.group):
            raise UsageError(f"--group {args.group!r}: a failure group id is 16 hex digits")
        query["group"] = args.group
    return query
