"""The ``users`` commands: the console's named users (docs/operations.md: Users and
roles), ``users add|list|set-role|disable|enable|remove|reset-password``.

A password is asked twice at the terminal (never echoed), or read from standard input
with ``--password-stdin`` (its first line; for scripts). Without a terminal and without
``--password-stdin`` the command refuses (exit code 2), as it does a weak password, a
malformed name and an unknown role (with a guess). A command sent to the process that
serves the store asks here and sends the password as its standard input
(:func:`forwarded_password`). Each change is audited, as the operating-system user who
ran it or the name given with ``--as``.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any

from messagebox.cli import inputs
from messagebox.cli.box import open_box
from messagebox.cli.terminal import Terminal
from messagebox.errors import ValidationError
from messagebox.ops import passwords

MAX_STDIN = 4 * passwords.MAX_PASSWORD + 2
"""The most of standard input read for a password (UTF-8, and a line break)."""
MAX_AS = 200
ASKS_PASSWORD = ("add", "reset-password")


def users_parser(sub: Any, command: Any) -> None:
    """``users add|list|set-role|disable|enable|remove|reset-password``."""
    users = command(sub, "users", "the console's users: add, list, change roles, disable, remove")
    users_sub = users.add_subparsers(dest="action", metavar="ACTION")
    command(users_sub, "list", "users, their roles, whether disabled, their open sessions")
    add = command(
        users_sub,
        "add",
        "add a user of the console (the password is asked twice)",
        description="Add a user who logs in to the console by name and password. Roles: "
        "reader (reads every page), operator (also resumes, terminates, reroutes, "
        "terminates instances, starts and stops services, delivers scheduled entries), "
        "admin (also changes filters and host settings, removes hosts). The password is "
        f"asked twice at the terminal; at least {passwords.MIN_PASSWORD} characters, not "
        "the name, not a common word; kept as an Argon2id hash.",
    )
    _name(add)
    add.add_argument("--role", required=True, metavar="reader|operator|admin", help="its role")
    _password_stdin(add)
    role = command(users_sub, "set-role", "give a user another role (from its next request)")
    _name(role)
    role.add_argument("--role", required=True, metavar="reader|operator|admin", help="its role")
    for action, text in (
        ("disable", "disable a user: its sessions end at once, it cannot log in"),
        ("enable", "enable a disabled user again"),
        ("remove", "remove a user: its sessions end at once"),
    ):
        _name(command(users_sub, action, text))
    reset = command(
        users_sub, "reset-password", "give a user a new password: its sessions end at once"
    )
    _name(reset)
    _password_stdin(reset)


def _name(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the user's name")
    parser.add_argument(
        "--as",
        dest="as_user",
        metavar="WHO",
        help="who is making the change, for the audit log (default: your user@machine)",
    )


def _password_stdin(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the password from standard input (its first line) instead of asking",
    )


def _checked(args: argparse.Namespace) -> None:
    """The name, role and ``--as`` checked before anything is asked (exit code 2)."""
    try:
        passwords.check_name(args.name)
        if getattr(args, "role", None) is not None:
            passwords.check_role(args.role)
    except ValidationError as exc:
        raise inputs.UsageError(str(exc)) from None
    who = getattr(args, "as_user", None)
    if who is not None and (not who.strip() or len(who) > MAX_AS or not who.isprintable()):
        raise inputs.UsageError(f"--as: give a printable name of at most {MAX_AS} characters")


def read_password(args: argparse.Namespace) -> str:
    """The new password: from standard input with ``--password-stdin`` (what was sent,
    for a served command), else asked twice at the terminal; checked (exit code 2)."""
    if args.password_stdin:
        sent = inputs.SENT.get()
        raw = sent.stdin if sent is not None else sys.stdin.buffer.read(MAX_STDIN + 1)
        password = _first_line(raw)
    elif inputs.SENT.get() is not None or not sys.stdin.isatty():
        raise inputs.UsageError(
            "no terminal to ask the password at: give it on standard input with "
            "--password-stdin; nothing was changed"
        )
    else:
        password = getpass.getpass(f"Password for {args.name}: ")
        if getpass.getpass("Again: ") != password:
            raise inputs.UsageError("the passwords differ; nothing was changed")
    try:
        passwords.check_password(password, args.name)
    except ValidationError as exc:
        raise inputs.UsageError(f"{exc}; nothing was changed") from None
    return password


def _first_line(raw: bytes) -> str:
    if len(raw) > MAX_STDIN:
        raise inputs.UsageError(
            f"the password is too long: at most {passwords.MAX_PASSWORD} characters"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise inputs.UsageError("the password on standard input is not UTF-8 text") from None
    line, _, rest = text.partition("\n")
    if rest.strip():
        raise inputs.UsageError("give the password alone, on one line of standard input")
    return line.removesuffix("\r")


def forwarded_password(args: argparse.Namespace) -> bytes | None:
    """For a command sent to a serving process: the password to send as its standard
    input (asked, or read, here), or None for a command that takes none."""
    if args.command != "users" or args.action not in ASKS_PASSWORD:
        return None
    _checked(args)
    return read_password(args).encode()


def users_list(args: argparse.Namespace, out: Terminal) -> None:
    """Every user, with its role, state and open sessions."""
    with open_box(args) as box:
        found = box.users()
        sessions = box.open_sessions()
    if out.json:
        out.emit([{**u.__dict__, "sessions": sessions.get(u.name, 0)} for u in found])
        return
    out.table(
        ["name", "role", "state", "created", "sessions"],
        [
            [
                u.name,
                u.role,
                "disabled" if u.disabled else "enabled",
                u.created_at.isoformat(timespec="seconds"),
                sessions.get(u.name, 0),
            ]
            for u in found
        ],
        empty="no users (`messagebox users add NAME --role reader|operator|admin` adds one)",
    )


def users_change(args: argparse.Namespace, out: Terminal) -> None:
    """``users add|set-role|disable|enable|remove|reset-password``."""
    _checked(args)
    password = read_password(args) if args.action in ASKS_PASSWORD else None
    args.audit_target = f"user {args.name}"
    with open_box(args) as box:
        if args.action == "add":
            assert password is not None
            user = box.add_user(args.name, args.role, password)
            said = f"added user {user.name!r} ({user.role})"
        elif args.action == "set-role":
            user = box.set_user_role(args.name, args.role)
            said = f"user {user.name!r} is now {_a(user.role)}"
        elif args.action in ("disable", "enable"):
            user = box.set_user_disabled(args.name, args.action == "disable")
            said = f"user {user.name!r} {args.action}d"
        elif args.action == "reset-password":
            assert password is not None
            user = box.set_user_password(args.name, password)
            said = f"user {user.name!r} has a new password; its sessions ended"
        else:
            box.remove_user(args.name)
            user, said = None, f"removed user {args.name!r}; its sessions ended"
    if out.json:
        out.emit({"action": args.action, "user": user if user is not None else args.name})
    else:
        out.say(said)


def _a(role: str) -> str:
    return f"{'an' if role[0] in 'aeiou' else 'a'} {role}"
