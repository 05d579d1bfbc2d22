"""The ``messagebox`` command.

    messagebox [--url URL] [--json] [--progress | --no-progress] COMMAND ...
    messagebox --version

    init                                   create (or upgrade) the schema
    publish [FILE ...] [-p NAME[:TYPE]=VALUE ...] [-w ...] [--properties-json JSON|@FILE]
            [--policy suspend|drop|raise] [--batch N]
                                           publish each file (or stdin) as one message
    subscriptions list [--host H] [--service S]
    subscriptions add SERVICE --host H --filter EXPR|JSON|@FILE [--name N] [--priority N]
            [--ordered | --ordered-by PROPERTY] [--on-failure suspend|stop]
            [--state started|stopped]
    subscriptions remove REF ...           by id or name; waiting entries are suspended
    subscriptions set-filter REF --filter EXPR|JSON|@FILE
                                           a new filter in place (id, waiting entries kept)
    route explain [MESSAGE_ID | JSON] [-p ...] [--properties-json ...] [--subscription REF]
                                           per subscription: routes or not, and why not
    services start | stop | unenlist SERVICE
                                           every subscription of a service
    hosts list | hosts add NAME [--set KEY=VALUE ...] | hosts set NAME --set KEY=VALUE ...
    hosts remove NAME                      a host nothing refers to any more
    messages show ID [--part NAME]         a stored message's body (--json: its context)
    queues [--host H]                      ready, held, blocked, leased per subscription
    instances [--host H]                   running host instances and their heartbeats
    search [FILTER] [--since AGE|TIME] [--until AGE|TIME] [--limit N] [--scan N] [--after C]
                                           messages matching a filter, newest first, with
                                           their state (deleted ones too, with tracking)
    orchestrations list [--service S] [--state S] [--limit N]
                                           orchestration instances, newest first
    orchestrations find NAME=VALUE ... [--service S] [--state S]
                                           the instances with these correlation values
    orchestrations show ID                 one instance: state, messages, timers, history
    orchestrations terminate ID [--yes]    end it; its queued messages are terminated
    suspended list [FILTERS] [--limit N]   FILTERS: --reason R --host H --service S
                                           --subscription REF --older-than 2h
                                           --error TEXT --group ID
    suspended show ID                      the entry, its error, its message's context
    suspended resume ID ... | --all-matching FILTERS [--yes]
    suspended terminate ID ... | --all-matching FILTERS [--yes]
    failures list                          suspended entries grouped by how they failed
    failures show ID [--limit N]           a failure group and its newest entries
    failures resume | terminate ID [--yes] every entry of a failure group
    suspended reroute [ID ...]             route routing failures again
    suspended resubmit ID [--body FILE] [-p ...] [--app MODULE:APP]
                                           publish a receive failure's input again
    cleanup [--batch N]                    delete unreferenced messages, dead leases
    stats                                  counts of everything
    check                                  the spool, queues and references agree
    tracking status | enable [--retention AGE] | disable
    tracking events [MESSAGE_ID] [--event E] [--host H] [--subscription REF] [--since AGE]
                                           a message's history, or the newest events
    metrics                                the store's gauges, in the Prometheus format
    export [--schema]                      the live hosts and subscriptions as a routing file
    plan FILE [--window AGE] [--no-traffic] [--spark]
                                           the diff with what is live, which messages move
    apply FILE [--dry-run] [--force] [--allow-empty]
                                           the file made live in one transaction (a version),
                                           unless lint finds errors (--force: even so)
    versions [N] [--limit N]               applied versions; N: that version's file
    rollback N                             apply version N's file again
    lint [FILE] [--window AGE]             never-matching, redundant, duplicate, misspelt, dead
    host run module:app [module:app ...] [--threads N] [--duration S] [--until-idle S]
            [--log-format text|json] [--metrics-port PORT] [--metrics-bind ADDR]
            [--console [ADDR:]PORT|off] [--token-file PATH]
                                           host instances of each app, in this process
    spark route … | spark what-if …        batch routing on Spark (pipelines/spark_cli.py)
    console [--bind ADDR] [--port N] [--token-file PATH] [--allowed-host NAME ...]
                                           the web console (token: MESSAGEBOX_CONSOLE_TOKEN)
    users list | add NAME --role reader|operator|admin [--password-stdin]
    users set-role NAME --role R | disable NAME | enable NAME | remove NAME
    users reset-password NAME [--password-stdin]
                                           the console's users (the password is asked)

The package: ``parser`` (the arguments), ``inputs`` (checking them), ``commands`` (which
function runs each command), the commands by group in ``subscriptions`` (and hosts),
``messages`` (publishing, queues, suspended entries), ``orchestrations`` (orchestration
instances), ``users`` (the console's users), ``search``, ``routing`` (``route explain``)
and ``operations`` (init, cleanup, stats, tracking, metrics), ``box`` (opening the
store), ``terminal`` (tables, JSON, progress).

A DuckDB store held by a running process (``host run``, ``console``) is reached through
it: the command is sent to that process (:mod:`messagebox.cli.remote`), found from the
endpoint file beside the database; ``--url http://HOST:PORT`` sends it to one explicitly.

``hosts`` and ``subscriptions`` alone list. The database URL comes from ``--url``, else
``MESSAGEBOX_URL``, else ``duckdb:///messagebox.duckdb``. Only ``init`` (and ``host run``)
create a database; the other commands refuse one that does not exist.

Values: ``-p orders.Total=12.5`` reads the value as JSON when it is a JSON scalar, else
as a string (``-p orders.Region=EU``); ``NAME:TYPE=VALUE`` forces a type: ``str``,
``int``, ``float``, ``bool`` or ``datetime`` (ISO 8601 with an offset or ``Z``:
``-p orders.At:datetime=2024-05-01T10:00:00Z``). ``--properties-json`` takes an object
of JSON scalars or typed ``["d", "2024-05-01T10:00:00+00:00"]`` pairs. A filter is its
text form (``orders.Region == "EU" and orders.Total >= 100``, see ``predicates.text``)
or its JSON form (``Filter.to_json``); ``@FILE`` reads either from a file.

Output: aligned tables for people; ``--json`` prints JSON for scripts (a list for
listings, an object otherwise; keys are stable; datetimes are ISO 8601 strings). Notes
and progress go to standard error; progress only when it is a terminal, or with
``--progress``.

Bulk changes are explicit: ``suspended resume|terminate`` take entry ids (all or none
change: an unknown id changes nothing), or ``--all-matching`` with at least one filter
(then in batches of 1000, with progress); ``failures resume|terminate`` a failure group.
Each prints how many entries it changed. A bulk change asks to confirm at a terminal
and, without one, needs ``--yes`` (:mod:`messagebox.cli.confirm`).

Exit codes:
    0  success
    1  a messagebox error: refused input, a storage or backend error (the message says which)
    2  bad usage: unknown options, malformed values, properties, filters, JSON, files,
       store URLs or host settings (--set); a bulk change with no terminal and no --yes
    3  not found: an unknown message, subscription, host, suspended entry or failure group
    4  `plan`, `apply --dry-run`: a change; `lint`: a finding; `check`: a problem
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from messagebox.cli.box import url_problem
from messagebox.cli.parser import build
from messagebox.cli.running import (
    EXIT_ERROR,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    run,
    shown_argv,
)
from messagebox.defaults import DEFAULT_URL
from messagebox.errors import MessageBoxError

__all__ = ["EXIT_ERROR", "EXIT_NOT_FOUND", "EXIT_OK", "EXIT_USAGE", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = build().parse_args(arguments)
    args.argv = shown_argv(arguments)
    if args.command == "host":
        return _host_run(args)
    if args.url is not None and not args.url.strip():  # (an empty MESSAGEBOX_URL is unset)
        return _bad_url(args.url)
    args.explicit_url = args.url or os.environ.get("MESSAGEBOX_URL")
    args.url = args.explicit_url or DEFAULT_URL
    from messagebox.cli import confirm, remote

    answered = confirm.ask(args)
    if answered is False:
        print(f"messagebox: nothing was {args.action}d", file=sys.stderr)
        return EXIT_ERROR
    if answered:  # confirmed here: a serving process runs it without asking again
        arguments.append("--yes")

    try:
        served = remote.endpoint_for(args.url)
    except MessageBoxError as exc:
        print(f"messagebox: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if served is not None:  # a running process holds the store: it runs the command
        return remote.forward(served, arguments, args)
    if url_problem(args.url) is not None:
        return _bad_url(args.url)
    if args.command == "spark":
        from messagebox.pipelines.spark_cli import run as spark

        return spark(args)
    if args.command == "console":
        from messagebox.console.cli import run as serve

        return serve(args)

    import logging

    from messagebox.cli.terminal import Terminal

    # the commands say the library's typing warnings themselves, as notes
    for said in ("messagebox.typecheck", "messagebox.lint"):
        quiet = logging.getLogger(said)
        quiet.addHandler(logging.NullHandler())
        quiet.propagate = False
    return run(args, Terminal(json_output=args.json, progress=args.progress))


def _bad_url(url: str) -> int:
    print(f"messagebox: error: {url_problem(url)}", file=sys.stderr)
    return EXIT_USAGE


def _host_run(args: argparse.Namespace) -> int:
    from messagebox.cli.hostrun import run as host_run

    return host_run(args)
