"""The generated parts of ``docs/reference.md``, made from the code so that they cannot
drift from it: the command line (from the argparse parser in
:mod:`messagebox.cli.parser`), the host settings (:class:`messagebox.HostSettings`), the
errors (:mod:`messagebox.errors`) and the Python API (signatures and docstrings).

A generated section sits between ``<!-- generated: NAME -->`` and
``<!-- end generated: NAME -->``; the text around the sections is written by hand.
``tests/docs/test_docs.py`` fails when a section differs from what the code makes now::

    .venv/bin/python -m tests.docs.reference           # check (exit 1 when out of date)
    .venv/bin/python -m tests.docs.reference --write   # rewrite the generated sections
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import functools
import importlib
import inspect
import re
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference.md"

_SECTION = re.compile(
    r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end generated: (?P=name) -->)",
    re.DOTALL,
)


# --- text helpers ---


def _cell(text: str) -> str:
    """Text for a Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|").replace("*", "\\*")


def _role(m: re.Match[str]) -> str:
    """A reST cross-reference as a code span: its title, or its last component with ``~``."""
    target = m.group(1)
    titled = re.fullmatch(r"(.+?)\s*<[^>]+>", target, re.DOTALL)
    if titled:
        return f"`{titled.group(1).strip()}`"
    if target.startswith("~"):
        return f"`{target[1:].split('.')[-1]}`"
    return f"`{target}`"


def _prose(doc: str | None) -> str:
    """A docstring as Markdown: reST roles and double backticks become code spans. A
    docstring may not cite the design notes (they are not in the repository)."""
    if not doc:
        return ""
    text = inspect.cleandoc(doc)
    text = re.sub(r":(?:class|meth|func|mod|data|attr|exc|obj):`([^`]+)`", _role, text)
    text = text.replace("``", "`")
    if "DESIGN.md" in text:  # the design notes are not in the repository
        raise ValueError(f"a docstring cites DESIGN.md, which readers cannot open: {text!r}")
    paragraphs = []
    for para in re.split(r"\n\s*\n", text):
        lines = para.splitlines()
        if lines and all(line.startswith("    ") or not line.strip() for line in lines):
            continue  # an indented example: left to the how-tos, whose samples run
        if lines and lines[0].lstrip().startswith(("- ", "* ")):
            paragraphs.append("\n".join(line.rstrip() for line in lines))
        else:
            paragraphs.append(" ".join(line.strip() for line in lines))
    return "\n\n".join(p for p in paragraphs if p.strip())


def _first_paragraph(doc: str | None) -> str:
    return _prose(doc).split("\n\n")[0] if doc else ""


# --- the command line ---


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=10_000)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="")
    text = " ".join(formatter.format_help().split()).replace(" [-h]", "")
    if parser.prog != "messagebox":  # every command's --json and --progress: said once
        text = text.replace(" [--json] [--progress | --no-progress]", "")
    return text


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.ArgumentParser, str]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {c.dest: c.help or "" for c in action._choices_actions}
            return {name: (p, helps.get(name, "")) for name, p in action.choices.items()}
    return {}


def command_paths() -> list[str]:
    """Every command of the ``messagebox`` parser, e.g. ``suspended resume``."""
    from messagebox.cli.parser import build

    found: list[str] = []

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        for name, (sub, _help) in _subcommands(parser).items():
            found.append(" ".join([*path, name]))
            walk(sub, [*path, name])

    walk(build(), [])
    return found


_COMMON = {"-h", "--json", "--progress"}


def _argument(action: argparse.Action) -> str:
    if action.option_strings:
        names = ", ".join(action.option_strings)
        if action.nargs == 0:
            return names
        metavar = action.metavar or (
            "{" + ",".join(map(str, action.choices)) + "}"
            if action.choices
            else action.dest.upper()
        )
        return f"{names} {metavar}"
    metavar = action.metavar or action.dest
    if action.nargs in ("*", "+"):
        return f"{metavar} ..."
    if action.nargs == "?":
        return f"[{metavar}]"
    return str(metavar)


def _meaning(action: argparse.Action) -> str:
    text = action.help or ""
    extras = []
    if action.choices and action.metavar is not None:
        extras.append("one of " + ", ".join(map(str, action.choices)))
    if action.required and action.option_strings:
        extras.append("required")
    default = action.default
    shown = default not in (None, False, [], argparse.SUPPRESS) and action.nargs != 0
    if shown and "default" not in text:
        extras.append(f"default: {default}")
    if isinstance(action, argparse._AppendAction) and "repeatable" not in text:
        extras.append("repeatable")
    return text + (f" ({'; '.join(extras)})" if extras else "")


def _arguments_table(parser: argparse.ArgumentParser, skip: set[str]) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
            continue
        if set(action.option_strings) & skip:
            continue
        argument = _argument(action).replace("|", "\\|")
        rows.append(f"| `{argument}` | {_cell(_meaning(action))} |")
    if not rows:
        return []
    return ["| argument | meaning |", "|---|---|", *rows, ""]


def _without_common(top: argparse.ArgumentParser) -> list[str]:
    """The commands that do not take the common options (``--json``, ``--progress``)."""
    found = []
    for name, (sub, _help) in _subcommands(top).items():
        leaves = [(f"{name} {a}", p) for a, (p, _h) in _subcommands(sub).items()] or [(name, sub)]
        for path, parser in leaves:
            if not any("--json" in a.option_strings for a in parser._actions):
                found.append(path)
    return found


def cli_section() -> str:
    from messagebox.cli.commands import COMMANDS
    from messagebox.cli.parser import build

    top = build()
    out = [
        "### `messagebox`",
        "",
        f"`{_usage(top)}`",
        "",
        _cell(top.description or ""),
        "",
        *_arguments_table(top, {"-h"}),
        "The commands also take `--json` and `--progress`/`--no-progress` after their "
        "name (`messagebox queues --json`), except "
        + ", ".join(f"`{c}`" for c in _without_common(top))
        + ".",
        "",
    ]
    for line in (top.epilog or "").splitlines():
        out += [_cell(line), ""]

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        for name, (sub, help_text) in _subcommands(parser).items():
            here = [*path, name]
            out.append(f"### `messagebox {' '.join(here)}`")
            out.append("")
            out.append(f"`{_usage(sub)}`")
            out.append("")
            out.append(_cell(sub.description or help_text))
            out.append("")
            if sub.epilog and sub.epilog != top.epilog:
                out.extend([_cell(sub.epilog), ""])
            actions = _subcommands(sub)
            if actions and len(here) == 1:
                alone = COMMANDS.get((name, ""))
                same = [a for a in actions if COMMANDS.get((name, a)) is alone and alone]
                listing = ", ".join(f"`{a}`" for a in actions)
                note = f"Actions: {listing}."
                if same:
                    note += f" Without an action it runs `{same[0]}`."
                out.extend([note, ""])
            out.extend(_arguments_table(sub, _COMMON))
            walk(sub, here)

    walk(top, [])
    return "\n".join(out).rstrip() + "\n"


# --- host settings ---


def _attribute_docs(cls: type) -> dict[str, str]:
    """The docstrings that follow attributes in a class body (or ``self.x = …`` in its
    ``__init__``), by attribute name."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    docs: dict[str, str] = {}
    [klass] = [n for n in tree.body if isinstance(n, ast.ClassDef)]

    def scan(body: list[ast.stmt], selfish: bool) -> None:
        for stmt, nxt in zip(body, [*body[1:], None], strict=True):
            if not (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)):
                continue
            if not isinstance(nxt.value.value, str):
                continue
            target: ast.expr | None = None
            if isinstance(stmt, ast.AnnAssign):
                target = stmt.target
            elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target = stmt.targets[0]
            if selfish and isinstance(target, ast.Attribute):
                docs.setdefault(target.attr, nxt.value.value)
            elif not selfish and isinstance(target, ast.Name):
                docs.setdefault(target.id, nxt.value.value)

    scan(klass.body, False)
    for node in klass.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            scan(node.body, True)
    return docs


def settings_section() -> str:
    from messagebox.models import HostSettings

    docs = _attribute_docs(HostSettings)
    out = ["| setting | default | meaning |", "|---|---|---|"]
    for name, field in HostSettings.model_fields.items():
        bounds = []
        for m in field.metadata:
            for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
                if getattr(m, attr, None) is not None:
                    bounds.append(f"{sign} {getattr(m, attr)}")
        meaning = _cell(_prose(docs.get(name, "")))
        if bounds:
            meaning += f" ({', '.join(bounds)})"
        out.append(f"| `{name}` | {field.default!r} | {meaning} |")
    return "\n".join(out) + "\n"


# --- errors ---


def errors_section() -> str:
    from messagebox import errors

    classes = [
        c
        for c in vars(errors).values()
        if isinstance(c, type)
        and issubclass(c, errors.MessageBoxError)
        and c.__module__ == errors.__name__
    ]
    out: list[str] = []

    def walk(parent: type, depth: int) -> None:
        for c in classes:
            if c.__bases__[0] is parent:
                out.append(f"{'  ' * depth}- `{c.__name__}`: {_cell(_first_paragraph(c.__doc__))}")
                walk(c, depth + 1)

    root = errors.MessageBoxError
    out.append(f"- `{root.__name__}`: {_cell(_first_paragraph(root.__doc__))}")
    walk(root, 1)
    import messagebox

    exported = [c.__name__ for c in classes if c.__name__ in messagebox.__all__]
    out += [
        "",
        "All are in `messagebox.errors`; these are importable from `messagebox` too: "
        + ", ".join(f"`{n}`" for n in exported)
        + ".",
    ]
    return "\n".join(out) + "\n"


# --- the Python API ---

API: list[tuple[str, list[tuple[str, list[str] | None]]]] = [
    (
        "messagebox",
        [
            (
                "messagebox.engine:MessageBox",
                [
                    "close",
                    "create_host",
                    "hosts",
                    "host",
                    "subscribe",
                    "subscribe_many",
                    "subscriptions",
                    "subscription",
                    "unsubscribe",
                    "set_service_state",
                    "publish",
                    "would_route",
                    "explain",
                    "receipts",
                    "read_message",
                    "read_messages",
                    "message_summary",
                    "iter_part",
                    "queue_depth",
                    "queue_stats",
                    "peek_queue",
                    "search",
                    "host_stats",
                    "stats",
                    "instances",
                    "suspended",
                    "suspended_entry",
                    "count_suspended",
                    "failure_groups",
                    "failure_group",
                    "resume",
                    "terminate",
                    "reroute",
                    "scheduled",
                    "deliver_now",
                    "cancel_scheduled",
                    "service_instances",
                    "find_instances",
                    "service_instance",
                    "terminate_instance",
                    "cleanup",
                    "check",
                    "references",
                    "export_config",
                    "plan",
                    "apply",
                    "versions",
                    "routing_version",
                    "rollback",
                    "lint",
                    "lint_subscriptions",
                    "add_user",
                    "users",
                    "user",
                    "set_user_role",
                    "set_user_disabled",
                    "set_user_password",
                    "remove_user",
                    "authenticate",
                ],
            ),
            ("messagebox.message:Message", []),
            ("messagebox.ops.failures:FailureGroup", None),
            ("messagebox.ops.users:User", None),
            ("messagebox.message:StoredMessage", None),
            ("messagebox.message:MessageSummary", None),
            ("messagebox.models:Routed", None),
            ("messagebox.models:Outcome", None),
            ("messagebox.models:RoutingPolicy", None),
            ("messagebox.models:Kind", None),
            ("messagebox.models:State", None),
            ("messagebox.models:OnFailure", None),
            ("messagebox.models:OnExpiry", None),
            ("messagebox.models:Host", None),
            ("messagebox.models:Subscription", None),
            ("messagebox.models:SuspendedEntry", None),
            ("messagebox.delivery.scheduled:ScheduledEntry", None),
            ("messagebox.models:QueueDepth", None),
            ("messagebox.models:QueueStats", None),
            ("messagebox.ops.browse:QueueEntry", None),
            ("messagebox.ops.search:SearchResult", None),
            ("messagebox.ops.search:FoundMessage", None),
            ("messagebox.models:HostStats", None),
            ("messagebox.models:Stats", None),
            ("messagebox.models:InstanceInfo", None),
            ("messagebox.models:InstanceState", None),
            ("messagebox.ops.orchestrations:ServiceInstanceView", None),
            ("messagebox.ops.instance_history:InstanceDetail", None),
            ("messagebox.ops.instance_history:InstanceMessage", None),
            ("messagebox.ops.instance_history:Publication", None),
            ("messagebox.ops.orchestrations:Terminated", None),
            ("messagebox.models:RouteExplanation", None),
            ("messagebox.models:SubscriptionExplanation", None),
            ("messagebox.delivery.cleanup:CleanupReport", None),
            ("messagebox.storage.consistency:Problem", None),
            ("messagebox.config.routing_file:RoutingConfig", None),
            ("messagebox.config.configs:Plan", None),
            ("messagebox.config.configs:Applied", None),
            ("messagebox.config.routing_apply:ConfigDiff", None),
            ("messagebox.config.routing_apply:SubscriptionChange", None),
            ("messagebox.config.routing_apply:HostChange", None),
            ("messagebox.config.routing_plan:TrafficEffect", None),
            ("messagebox.config.routing_plan:SubscriptionEffect", None),
            ("messagebox.config.routing_apply:ConfigVersion", None),
            ("messagebox.config.routing_lint:Finding", None),
        ],
    ),
    (
        "messagebox.predicates",
        [
            (
                "messagebox.predicates.dsl:P",
                ["exists", "not_exists", "bitwise_and", "prefix", "in_"],
            ),
            ("messagebox.predicates.dsl:to_filter", None),
            (
                "messagebox.predicates.model:Filter",
                ["of", "matches", "to_json", "from_json", "properties"],
            ),
            ("messagebox.predicates.text:parse_filter", None),
            ("messagebox.predicates.text:format_filter", None),
            ("messagebox.predicates.explain:explain", None),
        ],
    ),
    (
        "messagebox.hosts",
        [
            (
                "messagebox.hosts.app:HostApp",
                [
                    "service",
                    "add_service",
                    "subscribe",
                    "orchestration",
                    "receive_port",
                    "send_port",
                    "send_port_group",
                    "setup",
                    "instance",
                    "run",
                ],
            ),
            (
                "messagebox.hosts.instance:HostInstance",
                ["start", "stop", "run", "request_stop", "wake"],
            ),
            ("messagebox.hosts.dispatch:InstanceStats", None),
            (
                "messagebox.hosts.service:Delivery",
                [
                    "instance_id",
                    "message",
                    "properties",
                    "body",
                    "iter_part",
                    "publish",
                    "publish_on_completion",
                ],
            ),
            (
                "messagebox.hosts.orchestration:Orchestration",
                ["publish", "wait_for", "cancel_wait", "waiting_for", "complete"],
            ),
            ("messagebox.hosts.orchestration:activate", None),
            ("messagebox.hosts.orchestration:receive", None),
            ("messagebox.hosts.orchestration:timeout", None),
            ("messagebox.hosts.ports:ReceivePort", ["location"]),
            ("messagebox.hosts.ports:ReceiveLocation", []),
            ("messagebox.hosts.ports:SendPort", []),
            ("messagebox.hosts.ports:SendPortGroup", []),
            ("messagebox.hosts.ports:Transport", None),
        ],
    ),
    (
        "messagebox.pipelines",
        [
            ("messagebox.pipelines:XmlReceive", None),
            ("messagebox.pipelines:JsonReceive", None),
            ("messagebox.pipelines.schema:PropertySchema", []),
            ("messagebox.pipelines.schema:Field", None),
            ("messagebox.pipelines.schema:Promote", []),
            ("messagebox.pipelines.xml:XmlDisassembler", []),
            ("messagebox.pipelines.xml:XmlValidator", []),
            ("messagebox.pipelines.xml:XmlAssembler", []),
            ("messagebox.pipelines.json:JsonDisassembler", []),
            ("messagebox.pipelines.json:JsonValidator", []),
            ("messagebox.pipelines.json:JsonAssembler", []),
            ("messagebox.pipelines.component:Component", ["process", "fail"]),
            ("messagebox.pipelines.component:PipelineMessage", None),
            ("messagebox.pipelines.component:PipelineContext", None),
            ("messagebox.pipelines.component:ReceivePipeline", ["run", "run_each"]),
            ("messagebox.pipelines.component:SendPipeline", ["assemble"]),
        ],
    ),
    (
        "messagebox.pipelines.spark, messagebox.pipelines.whatif, "
        "messagebox.pipelines.spark_publish",
        [
            ("messagebox.pipelines.spark:session", None),
            ("messagebox.pipelines.spark:route_dataframe", None),
            ("messagebox.pipelines.spark:load_subscriptions", None),
            ("messagebox.pipelines.spark:write_routes", None),
            ("messagebox.pipelines.spark:Target", None),
            ("messagebox.pipelines.whatif:what_if", None),
            ("messagebox.pipelines.whatif:export_messages", None),
            ("messagebox.pipelines.whatif:WhatIf", None),
            ("messagebox.pipelines.whatif:WhatIfSummary", None),
            ("messagebox.pipelines.spark_publish:publish_dataframe", None),
            ("messagebox.pipelines.spark_publish:message_id", None),
            ("messagebox.pipelines.spark_publish:PublishReport", None),
        ],
    ),
    (
        "messagebox.adapters",
        [
            ("messagebox.adapters:register", None),
            ("messagebox.adapters:receive_adapter", None),
            ("messagebox.adapters:send_adapter", None),
            ("messagebox.adapters:schemes", None),
            ("messagebox.adapters.base:ReceiveAdapter", ["start", "stop"]),
            ("messagebox.adapters.base:SendAdapter", ["send", "close"]),
            ("messagebox.adapters.base:Sink", ["submit"]),
            ("messagebox.adapters.base:Inbound", ["of_bytes"]),
            ("messagebox.adapters.base:Submitted", None),
            ("messagebox.adapters.base:Outbound", None),
            ("messagebox.adapters.base:parse_options", None),
        ],
    ),
]
"""What the API section shows: per package, objects (``module:name``) and, for classes,
the members to show (``[]``: the constructor only; ``None``: fields or values)."""


OWNERS = {
    "MessageBox": "box",
    "HostInstance": "instance",
    "HostApp": "app",
    "Delivery": "delivery",
    "Orchestration": "self",
    "ReceivePort": "port",
    "P": "P(name)",
    "ReceivePipeline": "pipeline",
    "SendPipeline": "pipeline",
    "ReceiveAdapter": "adapter",
    "SendAdapter": "adapter",
}
"""How a method's owner is written: ``box.publish(…)``."""


def _default(value: Any) -> str:
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    return repr(value)


ALIASES = {"StoreURL": "str | sa.URL"}
"""Type aliases spelled out for readers (they are not part of the documented API)."""


def _annotation(annotation: object) -> str:
    """An annotation as written (a string, with ``from __future__ import annotations``)."""
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    for alias, meaning in ALIASES.items():
        text = re.sub(rf"\b{alias}\b", meaning, text)
    return text


def _signature(obj: Callable[..., Any], name: str, *, drop_self: bool = False) -> str:
    sig = inspect.signature(obj)
    params = []
    seen_star = False
    items = list(sig.parameters.values())
    if drop_self and items and items[0].name in ("self", "cls"):
        items = items[1:]
    for p in items:
        if p.kind is p.KEYWORD_ONLY and not seen_star:
            params.append("*")
            seen_star = True
        text = p.name
        if p.kind is p.VAR_POSITIONAL:
            text, seen_star = "*" + p.name, True
        elif p.kind is p.VAR_KEYWORD:
            text = "**" + p.name
        if p.annotation is not p.empty:
            text += f": {_annotation(p.annotation)}"
        if p.default is not p.empty:
            text += f" = {_default(p.default)}"
        params.append(text)
    text = f"{name}({', '.join(params)})"
    if sig.return_annotation not in (sig.empty, None, "None"):
        text += f" -> {_annotation(sig.return_annotation)}"
    return text


def _fields(cls: type) -> list[str]:
    """``name: type`` lines of a dataclass or a pydantic model, with their docs."""
    docs = _attribute_docs(cls)
    for base in cls.__mro__[1:]:
        for k, v in _attribute_docs(base).items():
            docs.setdefault(k, v)
    if dataclasses.is_dataclass(cls):
        fields = [
            (
                f.name,
                f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type)),
            )
            for f in dataclasses.fields(cls)
            if not f.name.startswith("_")
        ]
    else:
        annotations: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            annotations.update(getattr(klass, "__annotations__", {}))
        fields = [(n, str(t)) for n, t in annotations.items() if not n.startswith("_")]
    out = []
    for name, kind in fields:
        doc = _cell(_prose(docs.get(name)))
        out.append(f"- `{name}: {kind}`" + (f": {doc}" if doc else ""))
    return out


def _members(cls: type, names: list[str], owner: str) -> Iterator[str]:
    for name in names:
        member = inspect.getattr_static(cls, name)
        if isinstance(member, property | functools.cached_property):
            doc = member.__doc__ if isinstance(member, property) else member.func.__doc__
            yield f"- `{owner}.{name}` (property): {_cell(_prose(doc))}"
            continue
        if isinstance(member, classmethod | staticmethod):
            func = member.__func__
            title = f"{cls.__name__}.{name}"
            yield f"- `{_signature(func, title, drop_self=isinstance(member, classmethod))}`"
        else:
            func = member
            yield f"- `{_signature(func, f'{owner}.{name}', drop_self=True)}`"
        doc = _prose(func.__doc__)
        if doc:
            yield ""
            yield textwrap.indent(doc, "  ")
            yield ""


def api_section() -> str:
    out: list[str] = []
    for package, items in API:
        out += [f"### {package}", ""]
        for spec, members in items:
            module_name, _, name = spec.partition(":")
            obj = getattr(importlib.import_module(module_name), name)
            parts = module_name.split(".")
            public = ".".join(
                parts[:2] if parts[0] == "messagebox" and len(parts) > 2 else parts[:1]
            )
            where = (
                f"from {public} import {name}"
                if hasattr(importlib.import_module(public), name)
                else f"from {module_name} import {name}"
            )
            out += [f"#### `{name}`", "", f"`{where}`", ""]
            if isinstance(obj, type) and issubclass(obj, enum.Enum):
                out.append(_cell(_first_paragraph(obj.__doc__)) or f"`{name}` values:")
                out.append("")
                docs = _attribute_docs(obj)
                for member in obj:
                    doc = _cell(_prose(docs.get(member.name)))
                    out.append(
                        f"- `{name}.{member.name}` = `{member.value!r}`"
                        + (f": {doc}" if doc else "")
                    )
                out.append("")
                continue
            if isinstance(obj, type):
                constructed = (
                    members is not None
                    and not getattr(obj, "_is_protocol", False)  # a Protocol is not made
                    and not issubclass(obj, BaseModel)  # pydantic: **data
                    and obj.__init__ is not object.__init__
                )
                if constructed:
                    out += [f"`{_signature(obj.__init__, name, drop_self=True)}`", ""]  # type: ignore[misc]
                doc = _prose(obj.__doc__)
                if doc and not (dataclasses.is_dataclass(obj) and doc.startswith(f"{name}(")):
                    out += [doc, ""]
                if members is None:
                    out += [*_fields(obj), ""]
                else:
                    owner = OWNERS.get(name, name.lower())
                    out += [*_members(obj, members, owner), ""]
                continue
            out += [f"`{_signature(obj, name)}`", ""]
            doc = _prose(obj.__doc__)
            if doc:
                out += [doc, ""]
    text = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", text).rstrip() + "\n"


# --- the file ---

SECTIONS: dict[str, Callable[[], str]] = {
    "cli": cli_section,
    "settings": settings_section,
    "errors": errors_section,
    "api": api_section,
}


def render(text: str) -> str:
    """``text`` with every generated section made anew."""
    names = [m.group("name") for m in _SECTION.finditer(text)]
    missing = sorted(set(SECTIONS) - set(names))
    if missing:
        raise ValueError(f"docs/reference.md has no generated section {missing[0]!r}")
    unknown = sorted(set(names) - set(SECTIONS))
    if unknown:
        raise ValueError(f"docs/reference.md names an unknown generated section {unknown[0]!r}")
    made = {name: make() for name, make in SECTIONS.items()}
    return _SECTION.sub(
        lambda m: m.group(1) + "\n" + made[m.group("name")] + "\n" + m.group(4), text
    )


def main(argv: list[str]) -> int:
    current = REFERENCE.read_text(encoding="utf-8")
    fresh = render(current)
    if "--write" in argv:
        if fresh != current:
            REFERENCE.write_text(fresh, encoding="utf-8")
            print(f"rewrote the generated sections of {REFERENCE.relative_to(ROOT)}")
        return 0
    if fresh != current:
        print(
            f"{REFERENCE.relative_to(ROOT)} is out of date: run "
            ".venv/bin/python -m tests.docs.reference --write",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
