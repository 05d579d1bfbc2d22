"""The ``messagebox`` command line's arguments (what each command takes; see
:mod:`messagebox.cli` for the whole picture)."""

from __future__ import annotations

import argparse
import math
import textwrap
from typing import Any

from messagebox.cli import time_args
from messagebox.cli.config_args import config_parser
from messagebox.cli.failures import failures_parser
from messagebox.cli.orchestration_args import orchestrations_parser
from messagebox.cli.resubmit import resubmit_parser
from messagebox.cli.search import search_parser
from messagebox.cli.spark_args import spark_parser
from messagebox.cli.users import users_parser
from messagebox.defaults import DEFAULT_URL

EPILOG = (
    "exit codes: 0 success; 1 a messagebox error (the message names the culprit); 2 bad "
    "usage (options, values, properties, filters, JSON, files, store URLs, --set "
    "settings, a bulk change with no terminal and no --yes); 3 not found (an unknown "
    "message, subscription, host, suspended entry or failure group); 4 `plan`, `apply "
    "--dry-run`: there is a change, `lint`: there is a finding.\n"
    "environment: MESSAGEBOX_URL, the database URL when --url is not given."
)


class _Version(argparse.Action):
    """``--version``: the installed distribution's version (read only when asked)."""

    def __init__(self, option_strings: list[str], dest: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        import sys

        from messagebox import version

        sys.stdout.write(f"messagebox {version()}\n")
        parser.exit()


class _Formatter(argparse.HelpFormatter):
    """Wraps each line of a description or epilog on its own (keeps line breaks)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n".join(
            textwrap.fill(line, width, initial_indent=indent, subsequent_indent=indent)
            for line in text.splitlines()
        )


def build() -> argparse.ArgumentParser:
    """The ``messagebox`` command line."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print JSON (for scripts) instead of tables",
    )
    common.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=argparse.SUPPRESS,
        help="show progress on stderr (default: when stderr is a terminal)",
    )
    parser = argparse.ArgumentParser(
        prog="messagebox",
        description="Content-based publish/subscribe routing (BizTalk MessageBox style).",
        epilog=EPILOG,
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    parser.add_argument(
        "--url",
        help=f"database URL (default: $MESSAGEBOX_URL, else the host app's, else {DEFAULT_URL})",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=False,
        help="print JSON (for scripts) instead of tables; also after the command",
    )
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show progress on stderr (default: when stderr is a terminal)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(parent: Any, name: str, help: str, **kw: Any) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = parent.add_parser(
            name,
            help=help,
            description=kw.pop("description", help),
            parents=[common],
            epilog=EPILOG,
            formatter_class=_Formatter,
            **kw,
        )
        return p

    command(sub, "init", "create the schema, or upgrade it (idempotent)")

    publish = command(
        sub,
        "publish",
        "publish files (one message each) or stdin, with promoted properties",
        description="Publish each FILE as one message (its bytes are the body), or "
        "standard input when no FILE (or '-') is given. Every message gets the same "
        "properties. Prints where each went. A -p value without a TYPE is a number or a "
        "bool when it reads as one; a warning says so when the subscriptions that test "
        "that property compare it with another type (orders.Zip=12345 is an int, and "
        "never equals the string '12345').",
    )
    publish.add_argument("files", nargs="*", metavar="FILE", help="files to publish; '-' is stdin")
    _property_options(publish)
    publish.add_argument(
        "-w",
        "--written",
        action="append",
        default=[],
        metavar="NAME[:TYPE]=VALUE",
        help="a written (not routed) context property (repeatable)",
    )
    publish.add_argument(
        "--policy",
        default="suspend",
        choices=["suspend", "drop", "raise"],
        help="for a message that matches no subscription: suspend it (default), drop it, "
        "or refuse the batch",
    )
    publish.add_argument(
        "--batch",
        type=_positive,
        default=1000,
        help="files per transaction (default 1000): each batch is stored whole or not at all",
    )
    time_args.publish_options(publish)

    subs = command(sub, "subscriptions", "list, add, change and remove subscriptions")
    subs_sub = subs.add_subparsers(dest="action", metavar="ACTION")
    listing = command(subs_sub, "list", "list subscriptions with their filters")
    listing.add_argument("--host", help="only this host's")
    listing.add_argument("--service", help="only this service's")
    add = command(
        subs_sub,
        "add",
        "subscribe a service to the messages a filter matches",
        description="Subscribe a service to the messages a filter matches. The filter is "
        "its text form, e.g. 'orders.Region == \"EU\" and orders.Total >= 100' (operators "
        "== != > >= < <= in [..] prefix bitwise_and exists not_exists; and, or, "
        'parentheses; values: "strings", numbers, true, false, datetime("ISO")), its '
        "JSON form, or @FILE holding either.",
    )
    add.add_argument("service", metavar="SERVICE", help="the service that handles them")
    add.add_argument("--host", required=True, help="the host whose queue gets the messages")
    add.add_argument(
        "--name",
        help="the subscription's name, unique (default: SERVICE, or SERVICE-2, -3 … when taken)",
    )
    add.add_argument(
        "--service",
        dest="old_service",
        help=argparse.SUPPRESS,  # deprecated: `add NAME --service S` is `add S --name NAME`
    )
    add.add_argument("--filter", required=True, help="the filter: text, JSON or @FILE")
    add.add_argument("--priority", type=int, default=0, help="-1000..1000 (default 0)")
    add.add_argument("--ordered", action="store_true", help="deliver in publish order")
    add.add_argument(
        "--ordered-by",
        metavar="PROPERTY",
        help="deliver the messages with one value of PROPERTY (a key) in publish order, one "
        "at a time, different keys in parallel",
    )
    add.add_argument(
        "--on-failure",
        default="suspend",
        choices=["suspend", "stop"],
        help="ordered: what a message that exhausts its retries does (default suspend; stop "
        "stops the subscription, or with --ordered-by holds only its key)",
    )
    add.add_argument(
        "--on-expiry",
        default="suspend",
        choices=["suspend", "drop"],
        help="an entry that expires before delivery: suspend it (default) or drop it",
    )
    add.add_argument(
        "--state",
        default="started",
        choices=["started", "stopped"],
        help="stopped: messages are routed and held until the service starts (default started)",
    )
    remove = command(
        subs_sub,
        "remove",
        "remove subscriptions (by id or name); their waiting entries are suspended",
    )
    remove.add_argument("refs", nargs="+", metavar="REF", help="a subscription id or name")
    set_filter = command(
        subs_sub,
        "set-filter",
        "give a subscription a new filter in place (same id, waiting entries kept)",
    )
    set_filter.add_argument("ref", metavar="REF", help="a subscription id or name")
    set_filter.add_argument("--filter", required=True, help="the filter: text, JSON or @FILE")

    route = command(sub, "route", "explain routing")
    route_sub = route.add_subparsers(dest="action", required=True, metavar="ACTION")
    explain = command(
        route_sub,
        "explain",
        "for each subscription: whether a message routes to it, and if not, why",
        description="For each subscription: whether the message routes to it and, for "
        "each group of its filter that fails, the first predicate that fails and the "
        "property's actual value. Give a stored message's id, or properties (a JSON "
        "object, -p, --properties-json). Nothing is stored.",
    )
    explain.add_argument("target", nargs="?", help="a message id, or properties as a JSON object")
    _property_options(explain)
    explain.add_argument("--subscription", help="only this subscription (id or name)")

    services = command(sub, "services", "start, stop or unenlist a service")
    services_sub = services.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, text in (
        ("start", "route to it and release the messages held for it"),
        ("stop", "keep routing to it, holding its messages until it starts"),
        ("unenlist", "stop routing to it and suspend its waiting messages (resumable)"),
    ):
        state = command(services_sub, action, f"every subscription of a service: {text}")
        state.add_argument("service", help="the service (a subscription's --service)")

    hosts = command(sub, "hosts", "list, add, configure and remove hosts")
    hosts_sub = hosts.add_subparsers(dest="action", metavar="ACTION")
    command(hosts_sub, "list", "hosts, their instances, queue depths and suspended entries")
    host_add = command(hosts_sub, "add", "create a host")
    host_set = command(
        hosts_sub,
        "set",
        "change a host's settings (running instances keep theirs until restarted)",
    )
    host_remove = command(
        hosts_sub,
        "remove",
        "remove a host nothing refers to (no subscription, entry or running instance)",
    )
    host_remove.add_argument("name", help="the host's name")
    for host_command in (host_add, host_set):
        host_command.add_argument("name", help="the host's name")
        host_command.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="SETTING=VALUE",
            help="a host setting, e.g. dequeue_threads=8 (repeatable; see HostSettings)",
        )

    messages = command(sub, "messages", "read stored messages")
    messages_sub = messages.add_subparsers(dest="action", required=True, metavar="ACTION")
    show_message = command(
        messages_sub,
        "show",
        "write a stored message's body (or --part) to standard output, as stored; "
        "--json: its context and part sizes",
    )
    show_message.add_argument("id", help="the message id")
    show_message.add_argument("--part", help="this part instead of the body")

    queues = command(
        sub,
        "queues",
        "entries per host and subscription: ready, held, blocked, leased, scheduled, oldest",
        description="Entries per host and subscription: ready; held (the service is "
        "stopped); blocked (a suspended entry of their orchestration instance, or of their "
        "key, holds them until it is resumed or terminated); leased (being delivered); "
        "scheduled (not due yet), with the next due time; the oldest's age. With "
        "--held-keys: the keys of subscriptions ordered by a property (--ordered-by) that "
        "a suspended entry holds, each with that entry and how many wait behind it.",
    )
    queues.add_argument("--host", help="only this host")
    queues.add_argument(
        "--held-keys",
        action="store_true",
        help="list the keys suspended entries hold instead (resume or terminate the entry)",
    )
    instances = command(sub, "instances", "running host instances and their heartbeats")
    instances.add_argument("--host", help="only this host's")
    orchestrations_parser(sub, command, _positive)

    suspended = command(
        sub, "suspended", "list, show, resume, terminate, reroute, resubmit suspended entries"
    )
    sus_sub = suspended.add_subparsers(dest="action", required=True, metavar="ACTION")
    sus_list = command(sus_sub, "list", "suspended entries, oldest first")
    _suspended_filters(sus_list)
    sus_list.add_argument("--limit", type=_positive, default=1000, help="at most (default 1000)")
    show = command(sus_sub, "show", "one entry: its error, its message's context and parts")
    show.add_argument("id", type=_entry_id, help="a suspended entry id")
    for action, text in (
        ("resume", "put entries back on their queues (resumable ones)"),
        ("terminate", "delete entries and release their messages"),
    ):
        act = command(
            sus_sub,
            action,
            text,
            description=f"{text[0].upper()}{text[1:]}: the ids given (all or none), or "
            "with --all-matching every entry matching the filters (at least one).",
        )
        act.add_argument("ids", nargs="*", type=_entry_id, metavar="ID", help="suspended entry ids")
        act.add_argument(
            "--all-matching",
            action="store_true",
            help="every entry matching the filters (at least one filter is required)",
        )
        act.add_argument(
            "--dry-run",
            action="store_true",
            help=f"only list the entries it would {action}, changing nothing",
        )
        act.add_argument(
            "--yes",
            action="store_true",
            help="with --all-matching: do not ask to confirm (needed without a terminal)",
        )
        if action == "resume":
            time_args.resume_options(act)
        _suspended_filters(act)
    reroute = command(
        sus_sub, "reroute", "route routing failures and removed subscriptions' entries again"
    )
    reroute.add_argument("ids", nargs="*", type=_entry_id, metavar="ID", help="default: all")
    resubmit_parser(sus_sub, command, _entry_id, _property_options)
    time_args.scheduled_parser(sub, command, _positive)

    failures_parser(sub, command, _positive)
    cleanup = command(
        sub, "cleanup", "delete unreferenced messages, release dead instances' leases"
    )
    cleanup.add_argument("--batch", type=_positive, default=10_000, help="messages per transaction")
    command(sub, "stats", "counts: messages, queue entries, suspended, subscriptions, hosts")
    command(
        sub,
        "check",
        "whether the spool, the queues and the reference logs agree (exit code 4 if not)",
    )

    track = command(sub, "tracking", "message tracking: status, enable, disable, events")
    track_sub = track.add_subparsers(dest="action", metavar="ACTION")
    command(track_sub, "status", "whether tracking is enabled, and its retention")
    enable = command(
        track_sub,
        "enable",
        "record published, routed, delivered, failed, suspended, resumed, terminated events",
    )
    enable.add_argument(
        "--retention", metavar="AGE", help="keep events this long: 12h, 7d, 2w (default: 7d)"
    )
    command(track_sub, "disable", "stop recording (events recorded so far are kept)")
    events = command(
        track_sub,
        "events",
        "tracked events, oldest first: one message's history, or the newest matching",
    )
    events.add_argument("message_id", nargs="?", help="only this message's events")
    events.add_argument("--event", help="only this event (published, routed, delivered, …)")
    events.add_argument("--host", help="only this host's")
    events.add_argument("--subscription", metavar="REF", help="a subscription id or name")
    events.add_argument("--since", metavar="AGE", help="only the last AGE: 15m, 2h, 7d")
    events.add_argument("--limit", type=_positive, default=1000, help="at most (default 1000)")
    command(
        sub,
        "metrics",
        "print the store's metrics once, in the Prometheus text format",
        description="Print the store's gauges (queue depth, oldest entry, suspended "
        "entries, host instances, heartbeat ages) in the Prometheus text format: for a "
        "node_exporter textfile collector or a quick look. Counters of published, "
        "routed, delivered… messages live in the processes that do the work: scrape "
        "`messagebox host run --metrics-port` and `messagebox console` (/metrics).",
    )

    host = sub.add_parser("host", help="run host instances")
    host_sub = host.add_subparsers(dest="host_command", required=True)
    run = host_sub.add_parser(
        "run",
        help="run an instance of each HostApp until SIGINT/SIGTERM",
        description="Run an instance of each HostApp in this process until SIGINT/SIGTERM. "
        "The process serves the console and a management API (--console); on a DuckDB "
        "store it always does, on 127.0.0.1 at a free port unless told otherwise, and "
        "writes an endpoint file beside the database: every other messagebox command on "
        "that store is then run by this process.",
        formatter_class=_Formatter,
    )
    run.add_argument(
        "app", nargs="+", help="module:attribute of a hosts.HostApp (attribute: app); several"
    )
    run.add_argument(
        "--console",
        metavar="[ADDR:]PORT|off",
        help="serve the console and the management API here (default on DuckDB: "
        "127.0.0.1 at a free port; on PostgreSQL: none); off: never",
    )
    run.add_argument(
        "--token-file",
        metavar="PATH",
        help="the console token's file (else MESSAGEBOX_CONSOLE_TOKEN); without one the "
        "console is read-only",
    )
    run.add_argument(
        "--read-token-file",
        metavar="PATH",
        help="the read token's file (else MESSAGEBOX_CONSOLE_READ_TOKEN): readers log in "
        "with it; with one, every page of the console needs a login (/metrics: the token "
        "as a bearer token)",
    )
    run.add_argument("--threads", type=int, help="dequeue threads (default: host setting)")
    run.add_argument(
        "--duration", type=_seconds, metavar="SECONDS", help="stop after this many seconds"
    )
    run.add_argument(
        "--until-idle",
        type=_seconds,
        metavar="SECONDS",
        help="stop once every instance has had nothing to do for this many seconds (its "
        "claims empty, nothing in hand): what is queued is handled, then the process "
        "exits; a retry or a timer due later is left for the next run",
    )
    run.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    run.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="log lines as text, or as JSON objects (structured logs); default text",
    )
    run.add_argument(
        "--metrics-port",
        type=_port,
        metavar="PORT",
        help="serve this instance's counters and the store's gauges (Prometheus) at "
        "http://ADDR:PORT/metrics (ADDR: --metrics-bind)",
    )
    run.add_argument(
        "--metrics-bind",
        "--metrics-addr",
        default="127.0.0.1",
        metavar="ADDR",
        help="the address --metrics-port listens on (default 127.0.0.1, this machine "
        "only; 0.0.0.0 for a Prometheus server elsewhere)",
    )
    console = sub.add_parser(
        "console",
        help="serve the web console: hosts, queues, suspended entries, messages",
        description="Serve the web console: hosts, instances, queues, subscriptions, "
        "suspended entries, messages and routing explanations. Read-only unless a token "
        "is configured; then resume, terminate and the contents of message parts need it "
        "(a form field or an Authorization: Bearer header). It answers only to requests "
        "whose Host is the --bind address (on loopback also localhost, 127.0.0.1 and "
        "[::1]) or an --allowed-host: a guard against DNS rebinding.",
        epilog="environment: MESSAGEBOX_CONSOLE_TOKEN, the console token (--token-file "
        "wins); never give a token on the command line.",
        formatter_class=_Formatter,
        allow_abbrev=False,  # --token must not be read as --token-file
    )
    console.add_argument("--bind", default="127.0.0.1", help="address (default 127.0.0.1)")
    console.add_argument("--port", type=_port, default=8080, help="port (default 8080)")
    console.add_argument(
        "--token-file", metavar="PATH", help="a file whose first line is the console token"
    )
    console.add_argument(
        "--read-token-file",
        metavar="PATH",
        help="a file whose first line is the read token (else MESSAGEBOX_CONSOLE_READ_TOKEN): "
        "readers log in with it; with one, every page needs a login (/metrics: the token as "
        "a bearer token)",
    )
    console.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME[:PORT]",
        help="also answer to requests for this Host (a reverse proxy's name, say); any "
        "port unless one is given; repeatable. Bound to 0.0.0.0 or :: without any, the "
        "Host is not checked (a warning says so)",
    )
    console.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="log lines as text, or as JSON objects (structured logs); default text",
    )
    search_parser(sub, command, _positive)
    config_parser(sub, command, _positive)
    users_parser(sub, command)
    spark_parser(sub)
    return parser


def _property_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-p",
        "--property",
        action="append",
        default=[],
        dest="properties",
        metavar="NAME[:TYPE]=VALUE",
        help="a promoted property, e.g. orders.Total=12.5, orders.Region=EU, "
        "orders.At:datetime=2024-05-01T10:00:00Z (repeatable; TYPE: str int float bool "
        "datetime)",
    )
    parser.add_argument(
        "--properties-json",
        metavar="JSON|@FILE",
        help="promoted properties as a JSON object, e.g. '{\"orders.Total\": 12.5}'",
    )


def _suspended_filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reason", help="e.g. delivery-failure, routing-failure")
    parser.add_argument("--host", help="the entry's host")
    parser.add_argument("--service", help="the entry's subscription's service")
    parser.add_argument("--subscription", metavar="REF", help="a subscription id or name")
    parser.add_argument(
        "--older-than", metavar="AGE", help="suspended longer ago than AGE: 90s, 15m, 2h, 7d, 1h30m"
    )
    parser.add_argument("--error", metavar="TEXT", help="whose error contains TEXT (any case)")
    parser.add_argument("--group", metavar="ID", help="of this failure group (`failures list`)")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _port(text: str) -> int:
    value = _positive(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port (1-65535)")
    return value


def _entry_id(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a suspended entry id (an integer)"
        ) from None
