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
    """The MessageBox at the command's URL; only ``init`` creates one. A command that
    a running process serves uses that process's MessageBox (``args.served_box``), left
    open."""
    from messagebox.engine import MessageBox
    from messagebox.errors import NoSchema

    served: MessageBox | None = getattr(args, "served_box", None)
    if served is not None:
        yield served
        return

    try:
        box = MessageBox(args.url, create=create)
    except NoSchema as exc:
        raise NoSchema(f"{exc}; `messagebox init` creates it (or upgrades it)") from exc
    with box:
        yield box
