"""Routing as code, the storage side of :class:`~messagebox.engine.MessageBox`'s
``export_config``, ``plan``, ``apply``, ``versions``, ``rollback`` and ``lint``
(docs/howto-routing-as-code.md)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from messagebox.config import routing_apply, routing_lint, routing_plan, typecheck
from messagebox.config.routing_apply import ConfigDiff, ConfigVersion
from messagebox.config.routing_file import RoutingConfig, RoutingFileError, dump, load, read
from messagebox.config.routing_lint import Verdict
from messagebox.config.routing_plan import Page, Router, TrafficEffect
from messagebox.errors import ValidationError
from messagebox.predicates import Filter
from messagebox.storage import store_clock, subscriptions
from messagebox.storage.fence import Fence
from messagebox.storage.store import Store

DEFAULT_WINDOW = timedelta(hours=24)
PAGE = 5_000


@dataclass(frozen=True)
class Plan:
    """What applying a configuration would change, and its effect on recent traffic."""

    diff: ConfigDiff
    traffic: TrafficEffect | None
    blockers: tuple[str, ...] = ()
    """Why applying it now would be refused (a host it removes is not empty)."""
    lint: Verdict = field(default_factory=Verdict)
    """What lint finds: errors refuse the apply (unless forced), warnings are said."""

    @property
    def changed(self) -> bool:
        return self.diff.changed

    def describe(self) -> list[str]:
        lines = self.diff.describe() + [f"! {b}" for b in self.blockers]
        lines += [f"! lint error: {f}" for f in self.lint.errors]
        if self.lint.errors:
            lines.append(f"! apply refuses a file with lint errors unless {FORCE}")
        lines += [f"lint warning: {f}" for f in self.lint.warnings]
        return lines + (self.traffic.describe() if self.traffic else [])

    def as_json(self) -> dict[str, Any]:
        return {
            "changed": self.changed,
            "blockers": list(self.blockers),
            "lint": self.lint.as_json(),
            "changes": self.diff.as_json(),
            "traffic": self.traffic.as_json() if self.traffic else None,
        }


@dataclass(frozen=True)
class Applied:
    """What an apply changed, and the version it recorded (None: nothing to record)."""

    diff: ConfigDiff
    version: int | None
    lint: Verdict = field(default_factory=Verdict)
    """What lint found: the warnings, and the errors an apply was forced past."""


def as_config(source: RoutingConfig | str | Path) -> tuple[RoutingConfig, str]:
    """A configuration and its routing file's text, from a configuration (written out and
    read back, so it is checked as a file is), a file's path, or a file's text."""
    if isinstance(source, RoutingConfig):
        text = dump(source)
        return load(text, "<configuration>"), text
    if isinstance(source, Path):
        text = read(source)
        return load(text, str(source)), text
    if not isinstance(source, str):
        raise ValidationError(
            "a routing configuration is a RoutingConfig, a Path or a file's text, "
            f"not {type(source).__name__}"
        )
    try:
        return load(source), source
    except RoutingFileError:
        if "\n" not in source and source.strip().endswith(".toml"):
            raise ValidationError(
                f"{source!r} reads as a file's name, not its text: pass "
                "pathlib.Path(...) to read the file"
            ) from None
        raise


ALLOW_EMPTY = "--allow-empty (Python: allow_empty=True)"
"""What applies a configuration :func:`emptiness` finds a reason to refuse."""
FORCE = "--force (Python: force=True)"
"""What applies a configuration with lint errors."""


def _subs(config: RoutingConfig) -> list[tuple[str, str, Filter]]:
    return [(d.name, d.service, d.filter) for d in config.subscriptions.values()]


def verdict(live: RoutingConfig, wanted: RoutingConfig, carried: tuple[int, set[str]]) -> Verdict:
    """What lint finds in ``wanted`` about to replace ``live``, ``carried`` being what
    the newest stored messages say of property names (how many were read, the names):
    its errors are about the subscriptions it adds or whose filters it changes."""
    subs = _subs(wanted)
    found = routing_lint.config_findings(subs)
    read, known = carried
    if read:
        found += routing_lint.property_findings([(n, f) for n, _, f in subs], known)
    new = {
        name
        for name, decl in wanted.subscriptions.items()
        if name not in live.subscriptions or not live.subscriptions[name].same_filter(decl)
    }
    return routing_lint.verdict(found, new)


def refusal(lint: Verdict) -> str:
    """Why an apply with lint errors is refused, and how to apply it anyway."""
    shown = "".join(f"\n  {f}" for f in lint.errors)
    return (
        f"the routing file has {len(lint.errors)} lint error(s); nothing was applied:{shown}"
        f"\nFix them, or apply it with {FORCE} if that is what you mean (a property "
        "publishers do not send yet, say)"
    )


def emptiness(wanted: RoutingConfig, live: list[str]) -> str | None:
    """Why apply refuses ``wanted`` unless told to (``allow_empty``), given the names of
    the live subscriptions: it declares nothing, or no subscription while some are live
    (an export that failed half way, a file left empty). None: no such reason."""
    if wanted.declares_nothing:
        return (
            "the routing file declares no host, service or subscription (it is empty, or "
            "only comments): applying it would remove every host and subscription"
        )
    if not wanted.subscriptions and live:
        shown = ", ".join(sorted(live)[:5]) + (", …" if len(live) > 5 else "")
        return (
            "the routing file declares no subscription: applying it would remove all "
            f"{len(live)} live subscription(s) ({shown})"
        )
    return None


def _window(window: timedelta | float) -> float:
    seconds = window.total_seconds() if isinstance(window, timedelta) else float(window)
    if not seconds > 0:
        raise ValidationError(f"window must be positive, not {window!r}")
    return seconds


class Configs:
    """Routing configurations of one store."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def export(self) -> RoutingConfig:
        with self._store.transaction() as conn:
            return routing_apply.live_config(conn)

    def plan(
        self,
        wanted: RoutingConfig,
        window: timedelta | float | None,
        router: Router | None,
        progress: Callable[[int], None] | None = None,
    ) -> Plan:
        with self._store.transaction() as conn:
            live = subscriptions.list_subscriptions(conn)
            current = routing_apply.live_config(conn, live)
            change = routing_apply.diff(current, wanted)
            blockers = tuple(routing_apply.blockers(conn, change))
            carried = typecheck.carried(conn)
        lint = verdict(current, wanted, carried)
        empty = emptiness(wanted, list(current.subscriptions))
        if empty is not None:
            blockers += (f"{empty}: apply refuses it without {ALLOW_EMPTY}",)
        if window is None:
            return Plan(change, None, blockers, lint)
        seconds = _window(window)
        effect = TrafficEffect(window_seconds=seconds)
        if router is not None:
            effect.router = getattr(router, "name", "custom")
        pages = self._pages(seconds, effect, progress)
        before = routing_plan.targets(live, None)
        after = routing_plan.targets(live, wanted)
        for message_id, a, b in (router or routing_plan.route_in_process)(pages, before, after):
            effect.add(message_id, a, b)
        with self._store.transaction() as conn:
            effect.not_stored = routing_plan.not_stored(conn, self._since(conn, seconds))
        return Plan(change, effect, blockers, lint)

    def _since(self, conn: Any, seconds: float) -> Any:
        return store_clock.now(conn) - timedelta(seconds=seconds)

    def _pages(
        self,
        seconds: float,
        effect: TrafficEffect | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> Iterator[Page]:
        """The window's messages, a page (a transaction) at a time; ``progress(n)`` is
        called with the count read so far."""
        with self._store.transaction() as conn:
            since = self._since(conn, seconds)
        after: uuid.UUID | None = None
        n = 0
        while True:
            with self._store.transaction() as conn:
                page = routing_plan.window_page(conn, since, after, PAGE)
            if not page:
                return
            if effect is not None:
                effect.messages += len(page)
            n += len(page)
            if progress is not None:
                progress(n)
            yield page
            after = page[-1][0]

    def window_count(self, window: timedelta | float) -> int:
        seconds = _window(window)
        with self._store.transaction() as conn:
            return routing_plan.window_count(conn, self._since(conn, seconds))

    def apply(
        self,
        wanted: RoutingConfig,
        content: str,
        who: str,
        rollback_of: int | None = None,
        allow_empty: bool = False,
        force: bool = False,
    ) -> Applied:
        """Apply ``wanted``; unless a rollback, refuse it when :func:`verdict` finds
        errors (unless ``force``) or :func:`emptiness` a reason (unless ``allow_empty``)."""
        lint = Verdict()
        if rollback_of is None:
            with self._store.transaction() as conn:
                lint = verdict(routing_apply.live_config(conn), wanted, typecheck.carried(conn))
            if lint.errors and not force:
                raise ValidationError(refusal(lint))
        with self._store.transaction(serial=True, fence=Fence.CHANGES) as conn:
            if not allow_empty and rollback_of is None:
                self._refuse_empty(conn, wanted)
            change, version = routing_apply.apply(
                conn, self._store.dialect, wanted, content=content, who=who, rollback_of=rollback_of
            )
        self._store.host_ttls.invalidate()  # hosts' settings may have changed
        return Applied(change, version, lint)

    def _refuse_empty(self, conn: Any, wanted: RoutingConfig) -> None:
        live = [] if wanted.subscriptions else list(routing_apply.live_config(conn).subscriptions)
        empty = emptiness(wanted, live)
        if empty is not None:
            raise ValidationError(
                f"{empty}; nothing was applied. If that is what you mean, apply it with "
                f"{ALLOW_EMPTY}"
            )

    def versions(self, limit: int) -> list[ConfigVersion]:
        with self._store.transaction() as conn:
            return routing_apply.versions(conn, limit)

    def version(self, number: int) -> ConfigVersion:
        with self._store.transaction() as conn:
            return routing_apply.version(conn, number)

    def lint(
        self,
        config: RoutingConfig | None,
        window: timedelta | float | None,
        progress: Callable[[int], None] | None = None,
    ) -> list[routing_lint.Finding]:
        """Every finding about ``config`` (the live one by default); property names
        against the newest stored messages and, with ``window``, the window's."""
        if config is None:
            config = self.export()
        subs = _subs(config)
        found = routing_lint.config_findings(subs)
        with self._store.transaction() as conn:
            read, known = typecheck.carried(conn)
        pairs = [(n, f) for n, _, f in subs]
        traffic = routing_lint.Traffic()
        if window is not None:
            traffic = routing_lint.read_traffic(pairs, self._pages(_window(window), None, progress))
        if read or traffic.messages:
            found += routing_lint.property_findings(pairs, known | traffic.carried)
        return found + routing_lint.dead_findings(pairs, traffic)
