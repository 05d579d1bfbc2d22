"""Running a parsed store command: its exit code, its errors shown as the command line
shows them (here, or in the process that serves the store: :mod:`messagebox.cli.remote`)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from messagebox.errors import MessageBoxError, NotFound

if TYPE_CHECKING:
    from messagebox.cli.terminal import Terminal

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3


def run(args: argparse.Namespace, out: Terminal) -> int:
    """Run a parsed store command (not ``host``, ``spark`` or ``console``), showing its
    results and errors through ``out``; returns the exit code."""
    from messagebox.cli.commands import COMMANDS
    from messagebox.cli.config import EXIT_CHANGES, Changes
    from messagebox.cli.inputs import UsageError

    action = getattr(args, "action", None)
    name = f"{args.command} {action}" if action else args.command
    try:
        COMMANDS[(args.command, action or "")](args, out)
    except Changes:
        return EXIT_CHANGES
    except UsageError as exc:
        print(f"messagebox {name}: error: {exc}", file=out.stderr)
        return EXIT_USAGE
    except NotFound as exc:
        print(f"messagebox: {exc}", file=out.stderr)
        return EXIT_NOT_FOUND
    except MessageBoxError as exc:
        print(f"messagebox: {exc}", file=out.stderr)
        return EXIT_ERROR
    except BrokenPipeError:  # the reader went away (| head): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR
    return EXIT_OK


def shown_argv(argv: list[str]) -> list[str]:
    """The arguments without ``--url``'s value (it may hold a password)."""
    shown: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--url":
            skip = True
            continue
        if not a.startswith("--url="):
            shown.append(a)
    return shown
