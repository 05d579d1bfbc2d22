"""The ``messagebox`` command line as a user and a script run it, on DuckDB files (and a
few core commands on PostgreSQL).

Most tests run the command in this process (``cli``: :func:`tests.cli_support.run_cli`,
the same exit code, stdout and stderr as a subprocess with pipes, without ~2 s of
start-up per command). The few tests about the process boundary run it for real
(``cli_process``, or a pipeline): ``python -m messagebox.cli --help``, the installed
``messagebox`` script's exit status, standard input piped from another process, and
a reader that goes away (``| head``).

Each test starts from a copy of one small box made with the library: hosts shipping and
billing; ship-eu (orders.Region == "EU") and bill-big (orders.Total >= 100); an EU order
of 150 (routed to both), an EU order of 5 (ship-eu), a US order of 5 (a routing
failure); and bill's waiting entry suspended (service unenlisted, then started again).
"""

from __future__ import annotations

import json
import os
import pty
import shutil
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from messagebox import Message, MessageBox
from messagebox.models import ROUTING_FAILURE, SERVICE_UNENLISTED, InstanceInfo
from messagebox.predicates import Filter, P
from messagebox.storage import schema as mb_schema
from tests.cli_support import PROCESS_TIMEOUT, ROOT, process_env, run_cli, run_process
from tests.conftest import table_counts


def _argv(args: tuple[str, ...], url: str | None) -> list[str]:
    return [*(["--url", url] if url else []), *args]


def cli(
    *args: str, url: str | None = None, stdin: bytes = b"", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``messagebox [--url URL] ARGS`` in this process (stdin and stdout as pipes)."""
    return run_cli(_argv(args, url), stdin=stdin, env=env)


def cli_process(
    *args: str, url: str | None = None, stdin: bytes = b"", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m messagebox.cli [--url URL] ARGS`` as a subprocess (stdin and
    stdout are pipes): for tests about the process boundary only."""
    return run_process(_argv(args, url), stdin=stdin, env=env)


PYTHON_M = [sys.executable, "-m", "messagebox.cli"]


def pipeline(
    first: list[str], second: list[str]
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """``first | second`` as a shell runs it, from the repository's root: each one's exit
    status and output (first's stdout is the pipe, so it is empty here)."""
    env = process_env()
    out, err = subprocess.PIPE, subprocess.PIPE
    with (
        subprocess.Popen(first, stdout=out, stderr=err, cwd=ROOT, env=env) as writer,
        subprocess.Popen(
            second, stdin=writer.stdout, stdout=out, stderr=err, cwd=ROOT, env=env
        ) as reader,
    ):
        assert writer.stdout is not None
        writer.stdout.close()  # only the reader reads: when it goes, writes fail (EPIPE)
        try:
            shown, said = reader.communicate(timeout=PROCESS_TIMEOUT)
            _, first_said = writer.communicate(timeout=PROCESS_TIMEOUT)
        except subprocess.TimeoutExpired:
            reader.kill()
            writer.kill()
            raise
    return (
        subprocess.CompletedProcess(first, writer.returncode, "", first_said.decode()),
        subprocess.CompletedProcess(second, reader.returncode, shown.decode(), said.decode()),
    )


def ok(result: subprocess.CompletedProcess[str]) -> Any:
    """The JSON a successful ``--json`` command printed."""
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def counts(url: str) -> dict[str, int]:
    with MessageBox(url) as box:
        return table_counts(box)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "base.duckdb"
    with MessageBox(f"duckdb:///{path}") as box:
        box.create_host("shipping")
        box.create_host("billing")
        box.subscribe("ship", host="shipping", filter=P("orders.Region") == "EU", name="ship-eu")
        box.subscribe("bill", host="billing", filter=P("orders.Total") >= 100, name="bill-big")
        box.publish(
            [
                Message(b"<big/>", promoted={"orders.Region": "EU", "orders.Total": 150}),
                Message(b"<small/>", promoted={"orders.Region": "EU", "orders.Total": 5}),
                Message(b"<us/>", promoted={"orders.Region": "US", "orders.Total": 5}),
            ]
        )
        box.set_service_state("bill", "unenlisted")
        box.set_service_state("bill", "started")
    return path


@pytest.fixture
def url(base: Path, tmp_path: Path) -> str:
    shutil.copy(base, tmp_path / "box.duckdb")
    return f"duckdb:///{tmp_path / 'box.duckdb'}"


@pytest.fixture
def files(tmp_path: Path) -> list[str]:
    made = []
    for i in range(3):
        (tmp_path / f"order{i}.xml").write_bytes(f"<order n='{i}'/>".encode())
        made.append(str(tmp_path / f"order{i}.xml"))
    return made


def suspended_ids(url: str) -> dict[str, int]:
    with MessageBox(url) as box:
        return {e.reason: e.id for e in box.suspended()}


# --- creating, and refusing to create ---------------------------------------------------


def test_only_init_creates_a_database(tmp_path: Path) -> None:
    # Given a URL where no database is
    path = tmp_path / "new.duckdb"
    url = f"duckdb:///{path}"
    # When a command other than init runs, it refuses, naming the way out, creating nothing
    refused = cli("stats", url=url)
    assert refused.returncode == 1
    assert f"no database at {url}; `messagebox init` creates it" in refused.stderr
    assert not path.exists()
    # and init creates it, saying which schema version
    made = ok(cli("init", "--json", url=url))
    assert made == {"url": url, "schema_version": mb_schema.SCHEMA_VERSION}
    assert path.exists()


# --- setting up: hosts and subscriptions --------------------------------------------------


def test_hosts_and_subscriptions_are_added_and_listed(url: str) -> None:
    env = {"MESSAGEBOX_URL": url}  # the URL from the environment, as --help says
    # When a host and two subscriptions are added, one filter in text, one in JSON
    host = cli("hosts", "add", "audit", "--set", "dequeue_threads=2", "--json", env=env)
    assert ok(host)["settings"]["dequeue_threads"] == 2
    text = 'orders.Region in ["EU", "UK"] and orders.Total >= 1000 or orders.Audit exists'
    added = ok(cli("subscriptions", "add", "audit-big", "--host", "audit", "--filter", text,
                   "--priority", "5", "--json", env=env))  # fmt: skip
    filt = Filter.of(P("orders.At") > datetime.fromisoformat("2024-01-01T00:00:00+00:00"))
    as_json = ok(cli("subscriptions", "add", "audit", "--host", "audit", "--name",
                     "audit-late", "--filter", filt.to_json(), "--json", env=env))  # fmt: skip
    # Then the list shows both filters in the text form, which reads back to the same filter
    listed = {s["name"]: s for s in ok(cli("subscriptions", "list", "--json", env=env))}
    assert listed["audit-big"]["filter"] == (
        '(orders.Region in ["EU", "UK"] and orders.Total >= 1000) or orders.Audit exists'
    )
    assert listed["audit-big"]["service"] == "audit-big"  # named after the service
    assert (listed["audit-big"]["priority"], listed["audit-big"]["id"]) == (5, added["id"])
    assert listed["audit-late"]["filter"] == 'orders.At > datetime("2024-01-01T00:00:00+00:00")'
    assert Filter.from_json(json.dumps(listed["audit-late"]["filter_json"])) == filt
    assert as_json["service"] == "audit"
    with MessageBox(url) as box:
        assert box.subscription("audit-big").filter == Filter.of(
            P("orders.Region").in_(["EU", "UK"]) & (P("orders.Total") >= 1000)
            | P("orders.Audit").exists()
        )


def test_one_naming_the_service_first_and_a_default_name_after_it(backend_url: str) -> None:
    # The command line and Python name a subscription alike: SERVICE first, the name
    # after the service by default, then SERVICE-2, -3 … when it is taken
    url = backend_url
    with MessageBox(url):
        pass
    assert run_cli(["--url", url, "hosts", "add", "h"]).returncode == 0
    first = run_cli(["--url", url, "--json", "subscriptions", "add", "bill", "--host", "h",
                     "--filter", "a.B == 1"])  # fmt: skip
    assert first.returncode == 0, first.stderr
    with MessageBox(url) as box:
        second = box.subscribe("bill", host="h", filter=P("a.B") == 2)
        third = box.subscribe("bill", host="h", filter=P("a.B") == 3)
    assert (json.loads(first.stdout)["name"], second.name, third.name) == (
        "bill",
        "bill-2",
        "bill-3",
    )
    # The spelling of earlier versions still works, with a deprecation note
    old = run_cli(["--url", url, "--json", "subscriptions", "add", "bill-old", "--host", "h",
                   "--service", "bill", "--filter", "a.B == 4"])  # fmt: skip
    assert old.returncode == 0, old.stderr
    made = json.loads(old.stdout)
    assert (made["name"], made["service"]) == ("bill-old", "bill")
    assert "is deprecated; write `subscriptions add bill --name bill-old`" in old.stderr
    both = run_cli(["--url", url, "subscriptions", "add", "x", "--host", "h", "--service",
                    "bill", "--name", "y", "--filter", "a.B == 5"])  # fmt: skip
    assert both.returncode == 2


def test_hosts_list_is_an_aligned_table(url: str) -> None:
    result = cli("hosts", url=url)  # the old spelling lists too
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "HOST      INSTANCES  QUEUED  SUSPENDED  THREADS  MAX ATTEMPTS",
        "billing           0       0          1        4             5",
        "shipping          0       2          0        4             5",
    ]


# --- publishing ---------------------------------------------------------------------------


def test_publish_files_with_typed_properties_prints_where_each_went(
    url: str, files: list[str]
) -> None:
    # When three files are published in batches of two, with typed properties and progress
    result = cli(
        "publish", *files, "-p", "orders.Region=EU", "-p", "orders.Total=120",
        "-p", "orders.Zip:str=01234", "-p", "orders.At:datetime=2024-05-01T10:00:00+02:00",
        "-w", "orders.Note=rush", "--batch", "2", "--progress", "--json", url=url,
    )  # fmt: skip
    # Then each file is one message routed to both subscriptions
    published = ok(result)
    assert [p["file"] for p in published] == files
    assert {p["outcome"] for p in published} == {"routed"}
    assert {tuple(s["name"] for s in p["subscriptions"]) for p in published} == {
        ("ship-eu", "bill-big")
    }
    # and progress went to stderr, a line per batch
    assert "publishing: 2/3\npublishing: 3/3" in result.stderr
    # and the properties kept their types, the bodies their bytes
    with MessageBox(url) as box:
        stored = box.read_message(published[2]["message_id"])
    assert stored.promoted == {
        "orders.Region": "EU",
        "orders.Total": 120,
        "orders.Zip": "01234",
        "orders.At": datetime.fromisoformat("2024-05-01T08:00:00+00:00"),
    }
    assert type(stored.promoted["orders.Total"]) is int
    assert stored.written == {"orders.Note": "rush"}
    assert stored.body == b"<order n='2'/>"


def test_process_publish_from_stdin_piped_from_another_process(url: str) -> None:
    # When stdin, piped from another process, is published with properties as JSON,
    # matching nothing, with policy drop
    printed, result = pipeline(
        ["printf", "%s", "<piped/>"],
        [*PYTHON_M, "--url", url, "publish", "--properties-json",
         '{"orders.Region": "US", "orders.Total": 1.5}', "--policy", "drop"],
    )  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    # Then the table says it was dropped, and the summary goes to stderr
    assert result.returncode == 0, result.stderr
    header, row = result.stdout.splitlines()
    assert header.split() == ["FILE", "MESSAGE", "OUTCOME", "SUBSCRIPTIONS"]
    assert row.split()[0] == "-"
    assert row.split()[2:] == ["dropped", "-"]
    assert "published 1 message: 1 dropped" in result.stderr


# --- explaining routing -------------------------------------------------------------------


def test_route_explain_a_stored_message_says_why_each_subscription_misses(url: str) -> None:
    with MessageBox(url) as box:
        [small] = [
            m
            for m in box.read_messages(e.message_id for e in box.suspended()).values()
            if m.promoted.get("orders.Region") == "US"
        ]
    # When the US order of 5 (a routing failure) is explained
    found = ok(cli("route", "explain", str(small.id), "--json", url=url))
    # Then neither subscription takes it, and each names its failing predicate and value
    assert found["message_id"] == str(small.id)
    assert found["routes_to"] == []
    why = {s["name"]: s["groups"][0]["failed"] for s in found["subscriptions"]}
    assert why["ship-eu"] == {
        "predicate": 'orders.Region == "EU"',
        "property": "orders.Region",
        "op": "eq",
        "present": True,
        "actual": "US",
        "why": '"US" != "EU"',
    }
    assert why["bill-big"]["why"] == "5 < 100"


def test_route_explain_properties_as_a_table(url: str) -> None:
    # When properties are explained (one absent, one of another family)
    result = cli("route", "explain", "-p", "orders.Total=big", url=url)
    # Then the table shows, per subscription, the first failing predicate and why
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == 'a message with orders.Total="big"'
    assert lines[1] == "routes to 0 of 2 subscriptions"
    rows = [line.split("  ") for line in lines[3:]]
    assert "is absent" in lines[4]
    assert lines[5].endswith('"big" is a str, the predicate compares a number (values of '
                             "different families never compare)")  # fmt: skip
    assert len(rows) == 3


# --- queues, stats -----------------------------------------------------------------------


def test_queues_show_depth_and_the_oldest_entry_age(url: str) -> None:
    queues = ok(cli("queues", "--json", url=url))
    assert [(q["host"], q["name"], q["depth"], q["ready"], q["held"], q["leased"])
            for q in queues] == [("shipping", "ship-eu", 2, 2, 0, 0)]  # fmt: skip
    assert queues[0]["oldest_age_seconds"] >= 0
    datetime.fromisoformat(queues[0]["oldest_enqueued_at"])


def test_stats_count_everything(url: str) -> None:
    found = ok(cli("stats", "--json", url=url))
    assert found == {
        "messages": 3,
        "parts": 3,
        "part_bytes": 19,  # <big/> <small/> <us/>
        "queued": {"ready": 2, "held": 0, "blocked": 0, "leased": 0, "scheduled": 0},
        "suspended": {ROUTING_FAILURE: 1, SERVICE_UNENLISTED: 1},
        "subscriptions": {"started": 2},
        "hosts": 2,
        "host_instances": 0,
        "service_instances": {},
    }


# --- the suspended queue -----------------------------------------------------------------


def test_suspended_list_filters_and_show_details(url: str) -> None:
    listed = ok(cli("suspended", "list", "--host", "billing", "--older-than", "0s", "--json",
                    url=url))  # fmt: skip
    assert [(e["reason"], e["resumable"], e["subscription_name"], e["service"])
            for e in listed] == [(SERVICE_UNENLISTED, True, "bill-big", "bill")]  # fmt: skip
    shown = cli("suspended", "show", str(listed[0]["id"]), url=url)
    assert shown.returncode == 0, shown.stderr
    assert "reason        service-unenlisted (resumable)" in shown.stdout
    assert "subscription  bill-big" in shown.stdout
    assert "parts         body  6 B  (body)" in shown.stdout
    assert 'promoted      orders.Region = "EU"' in shown.stdout
    assert "error         its service was unenlisted before it was delivered" in shown.stdout


def test_resume_by_id_and_terminate_in_bulk(url: str) -> None:
    ids = suspended_ids(url)
    # When the unenlisted entry is resumed by id
    resumed = ok(cli("suspended", "resume", str(ids[SERVICE_UNENLISTED]), "--json", url=url))
    assert resumed == {"resumed": [ids[SERVICE_UNENLISTED]], "count": 1}
    # and a bulk resume of routing failures resumes none, and says what would
    none = cli("suspended", "resume", "--all-matching", "--reason", ROUTING_FAILURE, "--yes",
               url=url)  # fmt: skip
    assert none.stdout == "resumed 0 entries\n"
    assert "`messagebox suspended reroute` routes them again" in none.stderr
    # and a dry run lists what a bulk terminate would take, changing nothing
    before = counts(url)
    dry = ok(cli("suspended", "terminate", "--all-matching", "--reason", ROUTING_FAILURE,
                 "--dry-run", "--json", url=url))  # fmt: skip
    assert dry == {"would_terminate": [ids[ROUTING_FAILURE]], "count": 1}
    assert counts(url) == before
    # and every routing failure is terminated in bulk, with progress
    gone = cli("suspended", "terminate", "--all-matching", "--reason", ROUTING_FAILURE,
               "--progress", "--yes", url=url)  # fmt: skip
    # Then each prints how many it changed
    assert gone.returncode == 0, gone.stderr
    assert gone.stdout == f"terminated 1 entry: {ids[ROUTING_FAILURE]}\n"
    assert "terminate: 1/1" in gone.stderr
    with MessageBox(url) as box:
        assert box.suspended() == []
        assert sum(q.depth for q in box.queue_stats("billing")) == 1


@pytest.mark.parametrize("action", ["resume", "terminate"])
def test_a_bulk_change_without_a_terminal_needs_yes(url: str, action: str) -> None:
    # Given a script (standard input is not a terminal) that does not say --yes
    before = counts(url)
    refused = cli("suspended", action, "--all-matching", "--host", "billing", url=url)
    # Then nothing changes, and the error says how to mean it
    assert refused.returncode == 2
    assert "give --yes" in refused.stderr
    assert f"nothing was {action}d" in refused.stderr
    assert counts(url) == before
    assert refused.stdout == ""


def test_echo_n_piped_into_a_bulk_terminate_terminates_nothing(url: str) -> None:
    # Given `echo n | messagebox suspended terminate --all-matching …` (a pipe, no terminal)
    before = counts(url)
    refused = cli_process(
        "suspended", "terminate", "--all-matching", "--reason", ROUTING_FAILURE,
        url=url, stdin=b"n\n",
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert "nothing was terminated" in refused.stderr
    assert counts(url) == before


def at_a_terminal(url: str, answer: bytes, *args: str) -> subprocess.CompletedProcess[str]:
    """``messagebox ARGS`` as a subprocess whose standard input is a terminal (a
    pseudo-terminal), given ``answer`` as typed."""
    typing_end, terminal = pty.openpty()
    try:
        with subprocess.Popen(
            [*PYTHON_M, "--url", url, *args],
            stdin=terminal,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env=process_env(),
        ) as process:
            os.write(typing_end, answer)
            out, err = process.communicate(timeout=PROCESS_TIMEOUT)
    finally:
        os.close(typing_end)
        os.close(terminal)
    return subprocess.CompletedProcess(args, process.returncode, out.decode(), err.decode())


def test_a_bulk_terminate_asks_at_a_terminal(url: str) -> None:
    args = ("suspended", "terminate", "--all-matching", "--reason", ROUTING_FAILURE)
    before = counts(url)
    # When the operator answers no, nothing is terminated
    declined = at_a_terminal(url, b"n\n", *args)
    assert declined.returncode == 1, declined.stderr
    assert "Terminate them? [y/N]" in declined.stderr
    assert "nothing was terminated" in declined.stderr
    assert counts(url) == before
    # and when yes, it is
    accepted = at_a_terminal(url, b"y\n", *args)
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout.startswith("terminated 1 entry")
    with MessageBox(url) as box:
        assert box.suspended(reason=ROUTING_FAILURE) == []


# --- bad input: a clear error, nothing changed ------------------------------------------

BAD_INPUT = [
    # (arguments, exit code, what stderr says)
    (["publish", "{a}", "{missing}", "-p", "orders.Region=EU"], 2, "no file '"),
    (["publish", "{a}", "-p", "orders.Total"], 2, "'orders.Total' is not name=value"),
    (["publish", "{a}", "-p", "orders.At:datetime=2024-05-01"], 2, "has no time zone"),
    (["publish", "{a}", "--properties-json", '{"orders.Total": null}'], 2, "not a property"),
    (["publish", "{a}", "-p", "BTS.MessageType=x"], 1, "is in the reserved namespace"),
    (["subscriptions", "add", "x", "--host", "shipping", "--filter", "orders.Total >="], 2,
     "--filter: filter text, column 16: expected a value after '>='"),
    (["subscriptions", "add", "x", "--host", "nowhere", "--filter", "a.b exists"], 3,
     "no host named 'nowhere'"),
    (["subscriptions", "remove", "ship-eu", "999"], 3, "no subscription 999"),
    (["suspended", "resume", "{unenlisted}", "999"], 3, "no suspended entry 999"),
    (["suspended", "resume", "{failure}"], 1, "is not resumable (routing-failure)"),
    (["suspended", "terminate", "--all-matching"], 2, "--all-matching needs at least one filter"),
    (["suspended", "terminate", "--reason", "routing-failure"], 2, "only with --all-matching"),
    (["route", "explain", "01a20db1-0000-7000-8000-000000000000"], 3, "no message"),
    (["route", "explain", '{"orders.Total": }'], 2, "--properties-json is not JSON"),
    (["hosts", "add", "shipping"], 1, "host 'shipping' exists already"),
    (["suspended", "list", "--limit", "0"], 2, "0 is not positive"),
    (["tracking", "enable", "--retention", "0s"], 2, "--retention '0s': must be more than zero"),
    (["tracking", "enable", "--retention", "soon"], 2, "--retention 'soon': expected an age"),
    (["tracking", "events", "--event", "delivred"], 2, "--event 'delivred': one of published"),
    (["tracking", "events", "not-a-uuid"], 2, "'not-a-uuid' is not a message id"),
    (["tracking", "events", "01a20db1-0000-7000-8000-000000000000"], 3, "no message"),
    (["tracking", "events", "--host", "nowhere"], 3, "no host named 'nowhere'"),
    (["tracking", "events", "--subscription", "nothing"], 3, "no subscription"),
    (["tracking", "enable", "--retention", "40000d"], 1, "at most 36525 days, not 40000"),
    (["queues", "--host", "nowhere"], 3, "no host named 'nowhere'"),
    (["instances", "--host", "nowhere", "--json"], 3, "no host named 'nowhere'"),
    (["suspended", "list", "--older-than", "1000000d"], 2, "further back than the year 1"),
    (["suspended", "list", "--older-than", "9" * 30 + "d"], 2, "too long"),
    (["hosts", "add", "x", "--set", "max_attempts=abc"], 2,
     "host 'x': bad settings: max_attempts: input should be a valid integer"),
    (["hosts", "add", "x", "--set", "bogus=1"], 2, "'bogus' is not a setting (they are: "),
    (["console", "--port", "70000"], 2, "70000 is not a port (1-65535)"),
]  # fmt: skip


def test_bad_input_gives_a_clear_error_and_changes_nothing(url: str, files: list[str]) -> None:
    ids = suspended_ids(url)
    names = {
        "a": files[0],
        "missing": files[0] + ".missing",
        "unenlisted": str(ids[SERVICE_UNENLISTED]),
        "failure": str(ids[ROUTING_FAILURE]),
    }
    before = counts(url)
    for args, code, says in BAD_INPUT:
        result = cli(*(names.get(a.strip("{}"), a) if a[:1] == "{" else a for a in args), url=url)
        assert (result.returncode, result.stdout) == (code, ""), (args, result.stderr)
        assert says in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
    assert counts(url) == before


def test_tracking_from_the_command_line(url: str, files: list[str]) -> None:
    # Given tracking enabled for two days
    assert cli("tracking", url=url).stdout == "tracking is disabled (retention 7d 0h)\n"
    enabled = ok(cli("tracking", "enable", "--retention", "2d", "--json", url=url))
    assert enabled == {"enabled": True, "retention_seconds": 172800.0}
    # When an order is published
    [sent] = ok(cli("publish", files[0], "-p", "orders.Region=EU", "--json", url=url))
    # Then its history shows it published and routed, as JSON and as a table
    history = ok(cli("tracking", "events", sent["message_id"], "--json", url=url))
    assert [(e["event"], e["host"]) for e in history] == [
        ("published", None),
        ("routed", "shipping"),
    ]
    table = cli("tracking", "events", "--event", "routed", url=url).stdout.splitlines()
    assert table[0].split() == ["AT", "EVENT", "MESSAGE", "SUBSCRIPTION", "HOST", "ENTRY", "DETAIL"]
    assert "ship-eu" in table[1]
    assert sent["message_id"] in table[1]
    # and disabling keeps the retention and the events
    assert cli("tracking", "disable", url=url).stdout == "tracking is disabled (retention 2d 0h)\n"
    assert len(ok(cli("tracking", "events", "--json", url=url))) == 2


def test_metrics_prints_the_gauges_in_the_prometheus_format(url: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    result = cli("metrics", url=url)
    assert result.returncode == 0, result.stderr
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(result.stdout)
        for s in family.samples
    }
    assert samples[("messagebox_queue_depth", (("host", "shipping"), ("state", "ready")))] == 2
    assert samples[("messagebox_suspended_entries", (("reason", ROUTING_FAILURE),))] == 1
    assert samples[("messagebox_messages", ())] == 3
    as_json = ok(cli("metrics", "--json", url=url))
    assert {"name": "messagebox_messages", "labels": {}, "value": 3.0} in as_json


# --- PostgreSQL ----------------------------------------------------------------------------


def test_core_commands_on_postgresql(pg_url: str, files: list[str]) -> None:
    # Given a new PostgreSQL schema, set up from the command line
    assert cli("init", url=pg_url).returncode == 0
    assert cli("hosts", "add", "shipping", url=pg_url).returncode == 0
    sub = ok(cli("subscriptions", "add", "ship-eu", "--host", "shipping", "--filter",
                 'orders.Region == "EU"', "--json", url=pg_url))  # fmt: skip
    # When an EU and a US order are published
    eu = ok(cli("publish", files[0], "-p", "orders.Region=EU", "--json", url=pg_url))
    us = ok(cli("publish", "-p", "orders.Region=US", "--json", url=pg_url, stdin=b"x"))
    # Then the EU one waits on shipping's queue, the US one is suspended
    assert eu[0]["subscriptions"] == [{"id": sub["id"], "name": "ship-eu"}]
    queues = ok(cli("queues", "--json", url=pg_url))
    assert [(q["host"], q["depth"]) for q in queues] == [("shipping", 1)]
    [failure] = ok(cli("suspended", "list", "--json", url=pg_url))
    assert (failure["reason"], failure["message_id"]) == (ROUTING_FAILURE, us[0]["message_id"])
    # and explaining the US one names the region; bad input there changes nothing either
    found = ok(cli("route", "explain", us[0]["message_id"], "--json", url=pg_url))
    assert found["subscriptions"][0]["groups"][0]["failed"]["actual"] == "US"
    before = counts(pg_url)
    bad = cli("suspended", "terminate", str(failure["id"]), "999", url=pg_url)
    assert (bad.returncode, "no suspended entry 999" in bad.stderr) == (3, True)
    assert counts(pg_url) == before
    # Tracking works there too
    assert ok(cli("tracking", "enable", "--json", url=pg_url))["enabled"] is True
    ok(cli("suspended", "terminate", str(failure["id"]), "--json", url=pg_url))
    history = ok(cli("tracking", "events", us[0]["message_id"], "--json", url=pg_url))
    assert [e["event"] for e in history] == ["terminated"]


# --- the process boundary: the command as the shell runs it -------------------------------


def test_process_python_m_messagebox_cli_prints_help() -> None:
    shown = cli_process("--help")
    assert (shown.returncode, shown.stderr) == (0, "")
    assert shown.stdout.startswith("usage: messagebox ")
    for named in ("init", "publish", "subscriptions", "suspended", "tracking", "MESSAGEBOX_URL"):
        assert named in shown.stdout, named


def test_process_the_installed_script_exits_with_the_commands_code(url: str) -> None:
    script = Path(sys.executable).with_name("messagebox")  # the [project.scripts] entry point
    if not script.exists():
        pytest.skip(f"the console script is not installed ({script})")
    # When the script is asked to explain a message that is not stored
    found = run_process(
        ["--url", url, "route", "explain", "01a20db1-0000-7000-8000-000000000000"],
        command=[str(script)],
    )
    # Then the shell sees exit status 3 (not found), with the reason on stderr only
    assert (found.returncode, found.stdout) == (3, ""), found.stderr
    assert "no message" in found.stderr
    assert "Traceback" not in found.stderr


def test_process_a_reader_that_goes_away_stops_it_quietly(url: str) -> None:
    # Given far more suspended entries than a pipe holds (about 600 B of JSON each)
    with MessageBox(url) as box:
        box.publish(Message(b"x", promoted={"orders.Region": "US"}) for _ in range(500))
    # When they are listed into `| head -n 3`, which exits after three lines
    listed, head = pipeline(
        [*PYTHON_M, "--url", url, "suspended", "list", "--json"], ["head", "-n", "3"]
    )
    # Then head shows the first lines, and the command stops on the broken pipe quietly:
    # no traceback, no "Exception ignored ... BrokenPipeError", exit status 1
    assert head.returncode == 0, head.stderr
    assert head.stdout.splitlines()[:2] == ["[", "  {"]
    assert head.stdout.splitlines()[2].startswith('    "id": ')
    assert (listed.returncode, listed.stderr) == (1, "")


def test_instances_shows_one_without_a_recent_heartbeat_as_presumed_dead(
    backend_url: str,
) -> None:
    """(issue 21, item 9) An instance killed minutes ago stays registered until a live
    one of its host releases it; ``instances`` says it is presumed dead."""
    with MessageBox(backend_url) as box:
        box.create_host("h", heartbeat_seconds=1.0, dead_after_seconds=30.0)
        now = box.now()
        for name in ("alive", "killed"):
            box.consumer("h", name).register(
                InstanceInfo(name, "h", "box1", 1, now, now, "running")
            )
        with box.store.transaction() as conn:
            i = mb_schema.instance
            conn.execute(
                i.update().where(i.c.id == "killed").values(heartbeat_at=now - timedelta(minutes=3))
            )
    listed = cli("instances", url=backend_url)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert "presumed dead" in rows["killed"]
    assert "3m" in rows["killed"]
    assert "running" in rows["alive"]
    assert "presumed dead" not in rows["alive"]
    found = {r["id"]: r for r in json.loads(cli("instances", "--json", url=backend_url).stdout)}
    assert found["killed"]["presumed_dead"] is True
    assert found["killed"]["heartbeat_age_seconds"] >= 180
    assert found["alive"]["presumed_dead"] is False


def test_services_stop_start_and_unenlist_from_the_command_line(backend_url: str) -> None:
    """(issue 21, item 5) A service added stopped can be started from the CLI."""
    with MessageBox(backend_url) as box:
        box.create_host("h")
        box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="s1", state="stopped")
        box.publish([Message(b"x", promoted={"t.N": 1})])
        [held] = box.queue_stats()
        assert (held.ready, held.held) == (0, 1)
        started = cli("services", "start", "svc", url=backend_url)
        assert started.returncode == 0, started.stderr
        assert started.stdout.startswith("service 'svc' started (1 subscription)")
        [ready] = box.queue_stats()
        assert (ready.ready, ready.held) == (1, 0)
        stopped = cli("services", "stop", "svc", "--json", url=backend_url)
        assert json.loads(stopped.stdout) == {
            "service": "svc",
            "state": "stopped",
            "subscriptions": 1,
        }
        assert box.subscription("s1").state == "stopped"
        assert cli("services", "unenlist", "svc", url=backend_url).returncode == 0
        [entry] = box.suspended()
        assert entry.reason == SERVICE_UNENLISTED
        unknown = cli("services", "start", "nowhere", url=backend_url)
        assert unknown.returncode == 3
        assert "service 'nowhere' has no subscription" in unknown.stderr


def test_messages_show_writes_a_stored_part_as_it_is(backend_url: str) -> None:
    """(issue 21, item 5) The CLI prints a message's body, or another part."""
    with MessageBox(backend_url) as box:
        box.create_host("h")
        box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="s1")
        [routed] = box.publish(
            [Message(parts={"body": "é <order/>\n", "note": "n"}, promoted={"t.N": 1})]
        )
    msg = str(routed.message_id)
    body = cli("messages", "show", msg, url=backend_url)
    assert (body.returncode, body.stdout) == (0, "é <order/>\n")
    assert cli("messages", "show", msg, "--part", "note", url=backend_url).stdout == "n"
    shown = json.loads(cli("messages", "show", msg, "--json", url=backend_url).stdout)
    assert shown["promoted"] == {"t.N": 1}
    assert shown["parts"] == [{"name": "body", "size": 12}, {"name": "note", "size": 1}]
    missing = cli("messages", "show", msg, "--part", "nope", url=backend_url)
    assert missing.returncode == 3
    assert "has no part 'nope' (it has: body, note)" in missing.stderr
    assert cli("messages", "show", "not-a-uuid", url=backend_url).returncode == 2


def test_publish_warns_when_a_guessed_type_never_matches_the_subscriptions(
    url: str, files: list[str]
) -> None:
    """(issue 21, item 8) ``-p orders.Region=5`` is an int; the subscriptions compare
    orders.Region with strings, so the CLI says how to publish it as one."""
    trap = cli("publish", files[0], "-p", "orders.Region=5", "-p", "orders.Total=150", url=url)
    assert trap.returncode == 0, trap.stderr
    [warning] = [line for line in trap.stderr.splitlines() if line.startswith("warning:")]
    assert "-p orders.Region=5 is read as int" in warning
    assert warning.endswith("to publish it as str: -p orders.Region:str=5")
    typed = cli("publish", files[0], "-p", "orders.Region:int=5", url=url)
    assert typed.returncode == 0, typed.stderr
    assert "warning:" not in typed.stderr


def test_hosts_set_changes_a_setting(backend_url: str) -> None:
    """(issue 21, item 5) ``hosts set`` changes some settings of an existing host."""
    with MessageBox(backend_url) as box:
        box.create_host("h", max_attempts=3)
    done = cli("hosts", "set", "h", "--set", "max_attempts=9", url=backend_url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("host 'h': max_attempts=9 (running instances keep")
    shown = ok(cli("hosts", "set", "h", "--set", "claim_batch=5", "--json", url=backend_url))
    assert (shown["settings"]["max_attempts"], shown["settings"]["claim_batch"]) == (9, 5)
    bad = cli("hosts", "set", "h", "--set", "max_attempts=abc", url=backend_url)
    assert bad.returncode == 2  # bad usage, not a store that refuses
    assert "host 'h': bad settings: max_attempts" in bad.stderr
    assert (
        cli("hosts", "set", "nowhere", "--set", "max_attempts=2", url=backend_url).returncode == 3
    )
    assert cli("hosts", "set", "h", url=backend_url).returncode == 2


def test_process_bulk_terminate_asks_at_a_terminal(url: str) -> None:
    import os
    import pty

    with MessageBox(url) as box:
        box.create_host("h")
        box.publish([Message(b"x", promoted={"a.B": i}) for i in range(3)])  # routing failures
        failures = box.count_suspended(reason="routing-failure")
    assert failures >= 3
    argv = [sys.executable, "-m", "messagebox.cli", "--url", url, "suspended", "terminate",
            "--all-matching", "--reason", "routing-failure"]  # fmt: skip
    for answer, code, left in ((b"n\n", 1, failures), (b"y\n", 0, 0)):
        leader, follower = pty.openpty()
        try:
            proc = subprocess.Popen(
                argv, stdin=follower, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                cwd=ROOT, env=process_env(),
            )  # fmt: skip
            os.write(leader, answer)
            _, err = proc.communicate(timeout=PROCESS_TIMEOUT)
        finally:
            os.close(leader)
            os.close(follower)
        assert proc.returncode == code, err
        assert b"Terminate them? [y/N]" in err
        with MessageBox(url) as box:
            assert box.count_suspended(reason="routing-failure") == left


def test_process_orchestration_terminate_asks_at_a_terminal(url: str) -> None:
    import os
    import pty

    # Given a pending orchestration instance: routing made its convoy, no step ran yet
    with MessageBox(url) as box:
        box.create_host("orders")
        box.subscribe("fulfil", host="orders", filter=P("t.Kind") == "order",
                      correlation=["t.OrderId"])  # fmt: skip
        box.publish([Message(b"o", promoted={"t.Kind": "order", "t.OrderId": "A1"})])
        [pending] = box.find_instances({"t.OrderId": "A1"})
    argv = [sys.executable, "-m", "messagebox.cli", "--url", url, "orchestrations", "terminate",
            pending.id]  # fmt: skip
    # When the operator is asked at a terminal: no leaves it, yes terminates it
    for answer, code, state in ((b"n\n", 1, "pending"), (b"y\n", 0, "terminated")):
        leader, follower = pty.openpty()
        try:
            proc = subprocess.Popen(
                argv, stdin=follower, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                cwd=ROOT, env=process_env(),
            )  # fmt: skip
            os.write(leader, answer)
            _, err = proc.communicate(timeout=PROCESS_TIMEOUT)
        finally:
            os.close(leader)
            os.close(follower)
        assert proc.returncode == code, err
        assert f"of orchestration instance {pending.id}, with no way back".encode() in err
        with MessageBox(url) as box:
            [found] = box.find_instances({"t.OrderId": "A1"})
            assert found.state == state
