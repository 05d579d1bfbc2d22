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

:func:`load` refuses bad input with the file, line and key named; :func:`dump` writes the
form :func:`load` reads back to an equal configuration. :func:`json_schema` is the schema
published for editors (``docs/routing.schema.json``, ``messagebox export --schema``).
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from messagebox.errors import MessageBoxError, ValidationError
from messagebox.models import Host, HostSettings, Kind, OnFailure, State, Subscription
from messagebox.predicates import Filter, format_filter, parse_filter

SCHEMA_HINT = (
    "# messagebox routing file (docs/howto-routing-as-code.md). Its JSON Schema, for\n"
    "# editors: `messagebox export --schema > routing.schema.json`, then a first line\n"
    "# `#:schema ./routing.schema.json` (Taplo, Even Better TOML).\n"
)
"""The comment :func:`dump` starts a file with."""


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


def load(text: str, source: str = "<routing file>") -> RoutingConfig:
    """The configuration a routing file declares; :class:`RoutingFileError` names the
    file, line and key of the first problem."""
    where = _Locator(text, source)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RoutingFileError(f"{source}: not valid TOML: {exc}") from None
    try:
        parsed = _File.model_validate(raw)
    except pydantic.ValidationError as exc:
        # a misspelt key first: it explains the "missing" error that comes with it
        error = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]
        loc = tuple(error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = f"unknown key {str(loc[-1])!r}"
        elif error["type"] == "missing":
            message = f"{loc[-1]!r} is required"
        raise RoutingFileError(f"{where.at(loc)}: {message}") from None
    return _resolve(parsed, where)


def _resolve(parsed: _File, where: _Locator) -> RoutingConfig:
    from messagebox.catalog import check_name

    for host in parsed.hosts:
        try:
            check_name("host", host)
        except ValidationError as exc:
            raise RoutingFileError(f"{where.at(('hosts', host))}: {exc}") from None
    subs: dict[str, Declared] = {}
    services = {d.service for d in parsed.subscriptions}
    for name in parsed.services:
        if name not in services:
            raise RoutingFileError(
                f"{where.at(('services', name))}: service {name!r} has no subscription"
            )
    for i, decl in enumerate(parsed.subscriptions):
        name = decl.name or decl.service
        if name in subs:
            raise RoutingFileError(
                f"{where.at(('subscriptions', i, 'name'))}: a subscription named {name!r} "
                "is declared twice"
            )
        if decl.host not in parsed.hosts:
            raise RoutingFileError(
                f"{where.at(('subscriptions', i, 'host'))}: no host named {decl.host!r} "
                f"(declare it as [hosts.{decl.host}])"
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
        )
        _check_subscription(subs[name], where, i)
    return RoutingConfig(hosts=dict(parsed.hosts), subscriptions=subs)


def _check_subscription(decl: Declared, where: _Locator, i: int) -> None:
    """What subscribe would refuse, refused here with the file's line."""
    from messagebox.catalog import check_spec

    try:
        check_spec(i, decl.spec())
    except ValidationError as exc:
        raise RoutingFileError(f"{where.at(('subscriptions', i))}: {exc}") from None


_HEADER = re.compile(r"^\s*\[(\[)?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
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
    open before it."""
    at = 0
    while True:
        if inside is not None:
            end = line.find(inside, at)
            if end < 0:
                return inside
            at, inside = end + 3, None
            continue
        starts = [(line.find(d, at), d) for d in ('"""', "'''") if line.find(d, at) >= 0]
        if not starts:
            return None
        start, inside = min(starts)
        at = start + 3


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
            if header and not line.lstrip().startswith("#"):
                parts = _split_dotted(header.group(2))
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
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


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
        if decl.priority:
            item["priority"] = decl.priority
        if decl.on_failure is not OnFailure.SUSPEND:
            item["on_failure"] = decl.on_failure.value
        if decl.correlation:
            item["correlation"] = list(decl.correlation)
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
