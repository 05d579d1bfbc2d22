"""Opening the MessageBox a command works on."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from messagebox.engine import MessageBox


@contextmanager
def open_box(args: argparse.Namespace, *, create: bool = False) -> Iterator[MessageBox]:
    """The MessageBox at the command's URL; only ``init`` creates one."""
    from messagebox.engine import MessageBox
    from messagebox.errors import NoSchema

    try:
        box = MessageBox(args.url, create=create)
    except NoSchema as exc:
        raise NoSchema(f"{exc}; `messagebox init` creates it (or upgrades it)") from exc
    with box:
        yield box
