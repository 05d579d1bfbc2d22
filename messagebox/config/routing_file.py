"""The routing file: hosts, services and subscriptions declared in TOML
(docs/howto-routing-as-code.md).

    [hosts.shipping]
    dequeue_threads = 8

    [services.ship-eu]
    state = "started"

    [[subscriptions]]
    name = "ship-eu"
    service = "ship-eu"
    host = "shipping"
    filter = 'orders.Region == "EU" and orders.Total >= 100'

A host's table gives the settings that differ from the defaults; a service's, its state
(``started`` when not given); a subscription may set its own ``state`` apart from its
service's. The file declares the whole configuration: ``apply`` removes what it does not
name. Instance subscriptions of running orchestrations (those with an ``instance_id``)
are made at run time and are neither exported nor touched.

:func:`read` reads a file (a regular file of at most :data:`MAX_FILE_BYTES` of UTF-8);
:func:`load` refuses bad input with the file, line and key named (a UTF-8 byte-order mark
at the start is skipped); :func:`dump` writes the form :func:`load` reads back to an
equal configuration. :func:`json_schema` is the schema published for editors
(``docs/routing.schema.json``, ``messagebox export --schema``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tomllib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from messagebox.errors import MessageBoxError, ValidationError
from messagebox.models import Host, HostSettings, Kind, OnExpiry, OnFailure, State, Subscription
from messagebox.predicates import Filter, format_filter, parse_filter
from messagebox.suggest import did_you_mean

SCHEMA_HINT = (
    "# messagebox routing file (docs/howto-routing-as-code.md). Its JSON Schema, for\n"
    "# editors: `messagebox export --schema > routing.schema.json`, then a first line\n"
    "# `#:schema ./routing.schema.json` (Taplo, Even Better TOML).\n"
)
"""The comment :func:`dump` starts a file with."""

MAX_FILE_BYTES = 16 * 1024 * 1024
"""The largest routing file (or other file the command line reads as text) read: 16 MiB."""


class SubscriptionDecl(BaseModel):
    """A subscription as the file declares it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = Field(None, description="Unique; defaults to the service's name.")
    service: str
    host: str = Field(description="A host the file declares.")
    filter: str = Field(description='The filter\'s text form: orders.Region == "EU" and …')
    kind: Kind = Kind.ACTIVATION
    ordered: bool = False
    priority: int = Field(0, ge=-1000, le=1000)
    on_failure: OnFailure = OnFailure.SUSPEND
    correlation: list[str] = Field(default_factory=list)
    state: State | None = Field(
        None, description="This subscription's own state, if not its service's."
    )
    on_expiry: OnExpiry = Field(
        OnExpiry.SUSPEND,
        description="What becomes of an entry that expires before delivery: suspended "
        "(reason expired) or dropped.",
    )
    ordered_by: str | None = Field(
        None,
        description="A property: the messages with one value of it are delivered strictly "
        "in publish order, one at a time, different values in parallel.",
    )


class ServiceDecl(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    state: State = State.STARTED


class _File(BaseModel):
    """The file's top level (the JSON Schema is this model's)."""

    model_config = ConfigDict(extra="forbid", title="messagebox routing file")

    hosts: dict[str, HostSettings] = Field(default_factory=dict)
    services: dict[str, ServiceDecl] = Field(default_factory=dict)
    subscriptions: list[SubscriptionDecl] = Field(default_factory=list)


@dataclass(frozen=True)
class Declared:
    """One subscription of a configuration, resolved: its name, state and parsed filter."""

    name: str
    service: str
    host: str
    filter: Filter
    kind: Kind
    ordered: bool
    priority: int
    on_failure: OnFailure
    correlation: tuple[str, ...]
    state: State
    on_expiry: OnExpiry = OnExpiry.SUSPEND
    ordered_by: str | None = None

    def spec(self) -> dict[str, Any]:
        """As :meth:`~messagebox.engine.MessageBox.subscribe_many` takes it."""
        return {
            "name": self.name,
            "service": self.service,
            "host": self.host,
            "filter": self.filter,
            "kind": self.kind,
            "ordered": self.ordered,
            "priority": self.priority,
            "on_failure": self.on_failure,
            "correlation": list(self.correlation),
            "state": self.state,
            "on_expiry": self.on_expiry,
            "ordered_by": self.ordered_by,
        }

    @classmethod
    def of(cls, sub: Subscription) -> Declared:
        return cls(
            name=sub.name,
            service=sub.service,
            host=sub.host,
            filter=sub.filter,
            kind=sub.kind,
            ordered=sub.ordered,
            priority=sub.priority,
            on_failure=sub.on_failure,
            correlation=tuple(sub.correlation),
            state=sub.state,
            on_expiry=sub.on_expiry,
            ordered_by=sub.ordered_by,
        )

    def same_filter(self, other: Declared) -> bool:
        return filter_key(self.filter) == filter_key(other.filter)


def filter_key(filt: Filter) -> frozenset[frozenset[str]]:
    """Equal for filters with the same groups, in any order."""
    return frozenset(frozenset(p.key() for p in g.predicates) for g in filt.groups)


@dataclass(frozen=True)
class RoutingConfig:
    """A whole routing configuration: hosts with their settings, subscriptions by name."""

    hosts: dict[str, HostSettings]
    subscriptions: dict[str, Declared]

    def text(self) -> str:
        return dump(self)

    @property
    def declares_nothing(self) -> bool:
        """No host and no subscription (an empty file, or only comments)."""
        return not self.hosts and not self.subscriptions

    def digest(self) -> str:
        """A hash of the configuration (not of the file's spelling): sha256 of its dump."""
        return hashlib.sha256(dump(self).encode()).hexdigest()

    @classmethod
    def of(cls, hosts: Iterable[Host], subscriptions: Iterable[Subscription]) -> RoutingConfig:
        """The configuration a store holds (its subscriptions without an instance_id)."""
        return cls(
            hosts={h.name: h.settings for h in sorted(hosts, key=lambda h: h.name)},
            subscriptions={
                s.name: Declared.of(s)
                for s in sorted(subscriptions, key=lambda s: s.name)
                if s.instance_id is None
            },
        )


class RoutingFileError(ValidationError):
    """A routing file that cannot be applied; the message names file, line and key."""


# --- reading ---

_FILE_TYPES = {
    stat.S_IFDIR: "is a directory",
    stat.S_IFIFO: "is not a regular file (a FIFO)",
    stat.S_IFCHR: "is not a regular file (a character device)",
    stat.S_IFBLK: "is not a regular file (a block device)",
    stat.S_IFSOCK: "is not a regular file (a socket)",
}


def read_bytes(path: str | Path, what: str = "routing file", limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; :class:`RoutingFileError`
    names the file otherwise. A FIFO, a device or a directory is refused without
    reading from it (opened without waiting for a FIFO's writer); at most ``limit + 1``
    bytes are read."""
    name = str(path)
    try:
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise RoutingFileError(f"{what} {name!r}: cannot read it: {exc.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = _FILE_TYPES.get(stat.S_IFMT(mode), "is not a regular file")
        raise RoutingFileError(f"{what} {name!r} {kind}: give a file")
    with os.fdopen(fd, "rb") as file:
        try:
            data = file.read(limit + 1)
        except OSError as exc:
            raise RoutingFileError(f"{what} {name!r}: cannot read it: {exc.strerror}") from None
    if len(data) > limit:
        raise RoutingFileError(
            f"{what} {name!r} is larger than {_size(limit)}, the most that is read"
        )
    return data


def decode(data: bytes, source: str, what: str = "routing file") -> str:
    """UTF-8 ``data`` as text; :class:`RoutingFileError` names ``source`` and the byte
    offset of the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RoutingFileError(
            f"{what} {source!r} is not UTF-8 text (byte {exc.start}: "
            f"{data[exc.start : exc.start + 1]!r})"
        ) from None


def read(path: str | Path, what: str = "routing file", limit: int = MAX_FILE_BYTES) -> str:
    """A text file as :func:`read_bytes` and :func:`decode` check it."""
    return decode(read_bytes(path, what, limit), str(path), what)


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n % (1024 * 1024) == 0 else f"{n} bytes"


BOM = "\ufeff"
"""A UTF-8 byte-order mark, as a file's first character (skipped)."""


def load(text: str, source: str = "<routing file>") -> RoutingConfig:
    """The configuration a routing file declares; :class:`RoutingFileError` names the
    file, line and key of the first problem."""
    text = text.removeprefix(BOM)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RoutingFileError(f"{source}: not valid TOML: {exc}") from None
    except RecursionError:
        raise RoutingFileError(_too_deep(text, source)) from None
    where = _Locator(text, source)
    try:
        parsed = _File.model_validate(raw)
    except pydantic.ValidationError as exc:
        # a misspelt key first: it explains the "missing" error that comes with it
        error = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]
        loc = tuple(error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = f"unknown key {str(loc[-1])!r}{did_you_mean(str(loc[-1]), _keys_at(loc))}"
        elif error["type"] == "missing":
            message = f"{loc[-1]!r} is required"
        raise RoutingFileError(f"{where.at(loc)}: {message}") from None
    return _resolve(parsed, where)


def _keys_at(loc: tuple[Any, ...]) -> list[str]:
    """The keys the file may have where ``loc`` (an unknown key's place) is."""
    tables: dict[Any, type[BaseModel]] = {
        "hosts": HostSettings,
        "services": ServiceDecl,
        "subscriptions": SubscriptionDecl,
    }
    model = _File if len(loc) == 1 else tables.get(loc[0]) if len(loc) == 3 else None
    return list(model.model_fields) if model is not None else []


def _resolve(parsed: _File, where: _Locator) -> RoutingConfig:
    from messagebox.specs import check_name

    def check(what: str, name: str, loc: tuple[Any, ...]) -> None:
        try:
            check_name(what, name)
        except ValidationError as exc:
            raise RoutingFileError(f"{where.at(loc)}: {exc}") from None

    for host in parsed.hosts:
        check("host", host, ("hosts", host))
    subs: dict[str, Declared] = {}
    services = {d.service for d in parsed.subscriptions}
    for name in parsed.services:
        check("service", name, ("services", name))
        if name not in services:
            raise RoutingFileError(
                f"{where.at(('services', name))}: service {name!r} has no subscription"
            )
    for i, decl in enumerate(parsed.subscriptions):
        check("service", decl.service, ("subscriptions", i, "service"))
        if decl.name is not None:
            check("subscription", decl.name, ("subscriptions", i, "name"))
        name = decl.name or decl.service
        if name in subs:
            raise RoutingFileError(
                f"{where.at(('subscriptions', i, 'name'))}: a subscription named {name!r} "
                "is declared twice"
            )
        if decl.host not in parsed.hosts:
            hint = did_you_mean(decl.host, parsed.hosts)
            raise RoutingFileError(
                f"{where.at(('subscriptions', i, 'host'))}: no host named {decl.host!r}"
                + (hint or f" (declare it as [hosts.{_printable(decl.host)}])")
            )
        try:
            filt = parse_filter(decl.filter)
        except MessageBoxError as exc:
            raise RoutingFileError(f"{where.at(('subscriptions', i, 'filter'))}: {exc}") from None
        service_state = parsed.services.get(decl.service, ServiceDecl()).state
        subs[name] = Declared(
            name=name,
            service=decl.service,
            host=decl.host,
            filter=filt,
            kind=decl.kind,
            ordered=decl.ordered,
            priority=decl.priority,
            on_failure=decl.on_failure,
            correlation=tuple(decl.correlation),
            state=decl.state or service_state,
            on_expiry=decl.on_expiry,
            ordered_by=decl.ordered_by,
        )
        _check_subscription(subs[name], where, i)
    return RoutingConfig(hosts=dict(parsed.hosts), subscriptions=subs)


MAX_NESTING = 100
"""Levels of arrays and inline tables past which an error says where a file that is too
deep to parse nests (a routing file needs 2)."""

_TOKEN = re.compile(r"""\"\"\"|'''|["'#\[\]{}]""")
_BASIC_END = re.compile(r'(?:[^"\\\n]|\\.)*"')
_MULTI_BASIC_END = re.compile(r'(?:[^\\]|\\.)*?"""', re.DOTALL)


def _too_deep(text: str, source: str) -> str:
    """The error for a file nested too deeply to parse, naming the line where arrays and
    inline tables first nest more than :data:`MAX_NESTING` levels deep (or, if they
    never do, where they nest deepest): a scan that skips strings and comments."""
    pos = depth = deepest = deepest_at = 0
    while depth <= MAX_NESTING and (m := _TOKEN.search(text, pos)):
        token, pos = m.group(), m.end()
        if token in ("[", "{"):
            depth += 1
            if depth > deepest:
                deepest, deepest_at = depth, m.start()
        elif token in ("]", "}"):
            depth = max(depth - 1, 0)
        elif token == "#":
            pos = _line_end(text, pos)
        elif token == '"':
            basic = _BASIC_END.match(text, pos)
            pos = basic.end() if basic else _line_end(text, pos)
        elif token == "'":
            close = text.find("'", pos, _line_end(text, pos))
            pos = _line_end(text, pos) if close < 0 else close + 1
        elif token == '"""':
            multi = _MULTI_BASIC_END.match(text, pos)
            pos = multi.end() if multi else len(text)
        else:
            close = text.find("'''", pos)
            pos = len(text) if close < 0 else close + 3
    line = text.count("\n", 0, deepest_at) + 1
    return (
        f"{source}:{line}: arrays or inline tables are nested too deeply to read "
        f"(more than {min(deepest, MAX_NESTING)} levels)"
    )


def _line_end(text: str, pos: int) -> int:
    end = text.find("\n", pos)
    return len(text) if end < 0 else end


def _check_subscription(decl: Declared, where: _Locator, i: int) -> None:
    """What subscribe would refuse, refused here with the file's line."""
    from messagebox.specs import check_spec

    try:
        check_spec(i, decl.spec())
    except ValidationError as exc:
        raise RoutingFileError(f"{where.at(('subscriptions', i))}: {exc}") from None


_HEADER = re.compile(r"^\s*\[(\[)?([^\]]*)\]\]?\s*(#.*)?$")  # linear: no nested repeats
_DELIMITER = re.compile(r"\"\"\"|'''")
_KEY = re.compile(r"""^\s*("(?:[^"\\]|\\.)*"|'[^']*'|[A-Za-z0-9_-]+)\s*=""")


def _unquote(part: str) -> str:
    part = part.strip()
    if part[:1] in ("'", '"'):
        try:
            return str(tomllib.loads(f"k = {part}")["k"])
        except tomllib.TOMLDecodeError:
            return part
    return part


def _split_dotted(text: str) -> list[str]:
    return [_unquote(p) for p in re.findall(r"""("(?:[^"\\]|\\.)*"|'[^']*'|[^.]+)""", text)]


def _multiline_state(line: str, inside: str | None) -> str | None:
    """The multi-line string delimiter open after ``line`` (None: none), given the one
    open before it (one pass over the line)."""
    for m in _DELIMITER.finditer(line):
        if inside is None:
            inside = m.group()
        elif m.group() == inside:
            inside = None
    return inside


class _Locator:
    """Lines of the tables and keys of a routing file, to name in errors."""

    def __init__(self, text: str, source: str) -> None:
        self.source = source
        self.lines: dict[tuple[Any, ...], int] = {}
        table: tuple[Any, ...] = ()
        n_subs = -1
        inside: str | None = None  # the delimiter of a multi-line string being read
        for number, line in enumerate(text.splitlines(), start=1):
            starts_inside = inside is not None
            inside = _multiline_state(line, inside)
            if starts_inside:
                continue
            header = _HEADER.match(line)
            if header and header.group(2).strip() and not line.lstrip().startswith("#"):
                parts = _split_dotted(header.group(2).strip())
                if header.group(1):  # [[subscriptions]]
                    n_subs += 1
                    table = (*parts, n_subs)
                else:
                    table = tuple(parts)
                self.lines.setdefault(table, number)
                continue
            key = _KEY.match(line)
            if key:
                self.lines.setdefault((*table, _unquote(key.group(1))), number)

    def at(self, loc: Sequence[Any]) -> str:
        """``file:line: key`` for the deepest part of ``loc`` the file shows."""
        path = tuple(loc)
        for end in range(len(path), 0, -1):
            line = self.lines.get(path[:end])
            if line is None:  # a table named only by its sub-tables ([hosts.a] for hosts)
                line = min(
                    (n for k, n in self.lines.items() if k[:end] == path[:end]), default=None
                )
            if line is not None:
                return f"{self.source}:{line}: {_show(path)}"
        return f"{self.source}: {_show(path)}"


def _show(path: Sequence[Any]) -> str:
    out = ""
    for part in path:
        key = _printable(str(part))
        out += f"[{part}]" if isinstance(part, int) else (f".{key}" if out else key)
    return out


def _printable(name: str) -> str:
    """``name``, or its ``repr`` (escapes shown, not sent) when it holds a character that
    does not print, such as an escape character."""
    return name if name.isprintable() else repr(name)


# --- writing ---


def dump(config: RoutingConfig) -> str:
    """The configuration as a routing file (sorted; defaults left out)."""
    import tomli_w

    doc: dict[str, Any] = {
        "hosts": {
            name: settings.model_dump(exclude_defaults=True)
            for name, settings in sorted(config.hosts.items())
        }
    }
    states = _service_states(config.subscriptions.values())
    services = {
        s: {"state": st.value} for s, st in sorted(states.items()) if st is not State.STARTED
    }
    if services:
        doc["services"] = services
    text = SCHEMA_HINT + "\n" + tomli_w.dumps(doc)
    for decl in sorted(config.subscriptions.values(), key=lambda d: (d.service, d.name)):
        item: dict[str, Any] = {"name": decl.name, "service": decl.service, "host": decl.host}
        item["filter"] = format_filter(decl.filter)
        if decl.kind is not Kind.ACTIVATION:
            item["kind"] = decl.kind.value
        if decl.ordered:
            item["ordered"] = True
        if decl.ordered_by:
            item["ordered_by"] = decl.ordered_by
        if decl.priority:
            item["priority"] = decl.priority
        if decl.on_failure is not OnFailure.SUSPEND:
            item["on_failure"] = decl.on_failure.value
        if decl.correlation:
            item["correlation"] = list(decl.correlation)
        if decl.on_expiry is not OnExpiry.SUSPEND:
            item["on_expiry"] = decl.on_expiry.value
        if decl.state is not states[decl.service]:
            item["state"] = decl.state.value
        text += "\n[[subscriptions]]\n" + "".join(
            f"{k} = {_toml_value(v)}\n" for k, v in item.items()
        )
    return text


_LITERAL_SAFE = re.compile(r"[^'\x00-\x08\x0a-\x1f\x7f]*")


def _toml_value(value: Any) -> str:
    """One value in TOML; a string as a literal string ('...', no escapes) when it can
    be one, so that a filter's quotes read as written."""
    import tomli_w

    if isinstance(value, str) and _LITERAL_SAFE.fullmatch(value):
        return f"'{value}'"
    return tomli_w.dumps({"v": value}).removeprefix("v = ").rstrip("\n")


def _service_states(decls: Iterable[Declared]) -> dict[str, State]:
    """Each service's state: the one most of its subscriptions have (ties: started first)."""
    counts: dict[str, Counter[State]] = {}
    for d in decls:
        counts.setdefault(d.service, Counter())[d.state] += 1
    order = list(State)
    return {service: max(c, key=lambda s: (c[s], -order.index(s))) for service, c in counts.items()}


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the routing file (for editors)."""
    schema = _File.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


def settings_changes(old: HostSettings, new: HostSettings) -> dict[str, tuple[Any, Any]]:
    """The settings that differ: name → (old, new)."""
    a, b = old.model_dump(), new.model_dump()
    return {k: (a[k], b[k]) for k in a if a[k] != b[k]}


def as_mapping(config: RoutingConfig) -> Mapping[str, Any]:
    """The configuration as plain data (JSON output of the command line)."""
    data: dict[str, Any] = json.loads(json.dumps(tomllib.loads(dump(config)), default=str))
    return data
