"""Which function runs each ``messagebox`` command. Each checks its inputs, calls the
MessageBox and shows the result (a table or JSON) through a :class:`~messagebox.cli.
terminal.Terminal`; the logic lives in the library, this is presentation. The commands
are grouped: :mod:`~messagebox.cli.subscriptions` (subscriptions and hosts),
:mod:`~messagebox.cli.messages` (publishing, queues, suspended entries),
:mod:`~messagebox.cli.orchestrations` (orchestration instances),
:mod:`~messagebox.cli.routing` (``route explain``) and :mod:`~messagebox.cli.operations`
(schema, cleanup, statistics, tracking, metrics)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from messagebox.cli.config import apply, export, lint, plan, rollback, versions
from messagebox.cli.failures import failures_act, failures_list, failures_show
from messagebox.cli.messages import (
    instances,
    message_show,
    publish,
    queues,
    suspended_act,
    suspended_list,
    suspended_reroute,
    suspended_show,
)
from messagebox.cli.operations import (
    check,
    cleanup,
    init,
    metrics,
    stats,
    tracking_disable,
    tracking_enable,
    tracking_events,
    tracking_status,
)
from messagebox.cli.orchestrations import (
    orchestrations_list,
    orchestrations_show,
    orchestrations_terminate,
)
from messagebox.cli.resubmit import suspended_resubmit
from messagebox.cli.routing import route_explain
from messagebox.cli.scheduled import scheduled_act, scheduled_list
from messagebox.cli.search import search
from messagebox.cli.subscriptions import (
    hosts_add,
    hosts_list,
    hosts_remove,
    hosts_set,
    services_state,
    subscriptions_add,
    subscriptions_list,
    subscriptions_remove,
    subscriptions_set_filter,
)
from messagebox.cli.terminal import Terminal
from messagebox.cli.users import users_change, users_list

COMMANDS: dict[tuple[str, str], Callable[[argparse.Namespace, Terminal], None]] = {
    ("init", ""): init,
    ("export", ""): export,
    ("plan", ""): plan,
    ("apply", ""): apply,
    ("versions", ""): versions,
    ("rollback", ""): rollback,
    ("lint", ""): lint,
    ("publish", ""): publish,
    ("subscriptions", ""): subscriptions_list,
    ("subscriptions", "list"): subscriptions_list,
    ("subscriptions", "add"): subscriptions_add,
    ("subscriptions", "remove"): subscriptions_remove,
    ("subscriptions", "set-filter"): subscriptions_set_filter,
    ("route", "explain"): route_explain,
    ("services", "start"): services_state,
    ("services", "stop"): services_state,
    ("services", "unenlist"): services_state,
    ("hosts", ""): hosts_list,
    ("hosts", "list"): hosts_list,
    ("hosts", "add"): hosts_add,
    ("hosts", "set"): hosts_set,
    ("hosts", "remove"): hosts_remove,
    ("messages", "show"): message_show,
    ("queues", ""): queues,
    ("instances", ""): instances,
    ("orchestrations", ""): orchestrations_list,
    ("orchestrations", "list"): orchestrations_list,
    ("orchestrations", "find"): orchestrations_list,
    ("orchestrations", "show"): orchestrations_show,
    ("orchestrations", "terminate"): orchestrations_terminate,
    ("suspended", "list"): suspended_list,
    ("suspended", "show"): suspended_show,
    ("suspended", "resume"): suspended_act,
    ("suspended", "terminate"): suspended_act,
    ("suspended", "reroute"): suspended_reroute,
    ("suspended", "resubmit"): suspended_resubmit,
    ("failures", ""): failures_list,
    ("failures", "list"): failures_list,
    ("failures", "show"): failures_show,
    ("failures", "resume"): failures_act,
    ("failures", "terminate"): failures_act,
    ("scheduled", "list"): scheduled_list,
    ("scheduled", "deliver-now"): scheduled_act,
    ("scheduled", "cancel"): scheduled_act,
    ("cleanup", ""): cleanup,
    ("stats", ""): stats,
    ("check", ""): check,
    ("tracking", ""): tracking_status,
    ("tracking", "status"): tracking_status,
    ("tracking", "enable"): tracking_enable,
    ("tracking", "disable"): tracking_disable,
    ("tracking", "events"): tracking_events,
    ("metrics", ""): metrics,
    ("users", ""): users_list,
    ("users", "list"): users_list,
    ("users", "add"): users_change,
    ("users", "set-role"): users_change,
    ("users", "disable"): users_change,
    ("users", "enable"): users_change,
    ("users", "remove"): users_change,
    ("users", "reset-password"): users_change,
    ("search", ""): search,
}
"""The function of each (command, action); "" when there is no action."""
