"""Routing as code on :class:`~messagebox.engine.MessageBox`: export the configuration,
plan a change against recent traffic, apply it atomically, keep versions, roll back,
lint (docs/howto-routing-as-code.md).

    config = box.export_config()                 # what is live, as a RoutingConfig
    plan = box.plan(Path("routing.toml"))        # the diff, and which messages move
    applied = box.apply(Path("routing.toml"))    # one transaction; a new version
    box.rollback(applied.version - 1)
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from messagebox.config.catalog import Catalog
from messagebox.config.configs import DEFAULT_WINDOW, Applied, Configs, Plan, as_config
from messagebox.config.routing_apply import ConfigVersion
from messagebox.config.routing_file import RoutingConfig, load
from messagebox.config.routing_lint import Finding
from messagebox.config.routing_plan import Router
from messagebox.storage.audit import local_user

Source = RoutingConfig | str | Path
"""A configuration, a routing file's path (a ``Path``), or a routing file's text (a ``str``)."""


class RoutingAsCode:
    """The routing-as-code methods of a MessageBox."""

    configs: Configs
    catalog: Catalog

    def export_config(self) -> RoutingConfig:
        """The live configuration: every host, and every subscription but the instance
        subscriptions made at run time. ``.text()`` is it as a routing file."""
        return self.configs.export()

    def plan(
        self,
        config: Source,
        *,
        window: timedelta | float | None = DEFAULT_WINDOW,
        router: Router | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> Plan:
        """What applying ``config`` would change (``plan.diff``), and, over the messages
        stored in the last ``window`` (None: skip it), which subscriptions would gain or
        lose which messages and which would become or stop being routing failures
        (``plan.traffic``). ``router`` routes the window elsewhere (Spark:
        ``messagebox.pipelines.whatif.spark_router(spark)``); ``progress(n)`` hears how
        many messages were read so far. ``plan.lint`` is what :meth:`apply` would find:
        its errors refuse the apply, its warnings are said. Changes nothing."""
        wanted, _ = as_config(config)
        return self.configs.plan(wanted, window, router, progress)

    def apply(
        self,
        config: Source,
        *,
        who: str | None = None,
        allow_empty: bool = False,
        force: bool = False,
    ) -> Applied:
        """Make ``config`` the live configuration in one transaction (a publish routes
        by the old subscriptions or the new ones, never a mix) and record it as a new
        version (unless nothing changed). Bad input changes nothing. Lint runs first: an
        error (a group or filter that can never match, a property no stored message
        carries) in a subscription it adds or whose filter it changes refuses it unless
        ``force``; the warnings are in ``applied.lint``. A file that declares nothing,
        or no subscription while some are live, is refused unless ``allow_empty``."""
        wanted, text = as_config(config)
        return self.configs.apply(
            wanted, text, who or local_user(), allow_empty=allow_empty, force=force
        )

    def versions(self, limit: int = 100) -> list[ConfigVersion]:
        """The newest applied versions, newest first."""
        return self.configs.versions(limit)

    def routing_version(self, number: int) -> ConfigVersion:
        """One applied version, with its routing file (``.content``)."""
        return self.configs.version(number)

    def rollback(self, number: int, *, who: str | None = None) -> Applied:
        """Apply version ``number``'s routing file again (recorded as a new version)."""
        old = self.configs.version(number)
        assert old.content is not None
        wanted = load(old.content, f"version {number}")
        return self.configs.apply(wanted, old.content, who or local_user(), rollback_of=number)

    def lint_subscriptions(self, *refs: int | str) -> list[Finding]:
        """Findings about live subscriptions (by id or name): groups of their filters
        that never match or that another group covers, the other subscriptions of
        their services that match the same messages, and property names none of the
        newest stored messages carries. ``subscribe`` and ``set_filter`` log these
        (logger ``messagebox.lint``)."""
        return self.catalog.lint([self.catalog.subscription(r) for r in refs])

    def window_count(self, window: timedelta | float) -> int:
        """How many stored messages were published in the last ``window``."""
        return self.configs.window_count(window)

    def lint(
        self,
        config: Source | None = None,
        *,
        window: timedelta | float | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> list[Finding]:
        """Findings about ``config``'s subscriptions (the live ones by default): groups
        that never match, redundant groups, duplicates, property names none of the
        newest stored messages carries (with the nearest one they do); with ``window``,
        also the subscriptions that matched none of the messages stored in it (and the
        property names they carry count as known)."""
        wanted = None if config is None else as_config(config)[0]
        return self.configs.lint(wanted, window, progress)
