"""Findings about subscriptions: groups that can never match, groups another group of
the same filter already covers, subscriptions of one service that match the same
messages, property names no stored message carries (typos), and, against a window of
stored traffic, subscriptions that matched nothing. The logic is
:mod:`messagebox.predicates.lint` (exact); this module words the findings, and sorts
them into what refuses an apply and what it only warns about (:func:`verdict`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from messagebox.predicates import Filter, Group, Predicate, format_filter
from messagebox.predicates.index import FilterIndex, compile_predicate
from messagebox.predicates.lint import equivalent, implies, satisfiable, witness
from messagebox.predicates.model import Op, predicate_holds
from messagebox.predicates.text import format_predicate
from messagebox.properties import Family, Value, family
from messagebox.suggest import did_you_mean

NEVER = "never-matches"
UNSATISFIABLE = "unsatisfiable-group"
REDUNDANT = "redundant-group"
DUPLICATE = "duplicate"
DEAD = "dead"
UNKNOWN_PROPERTY = "unknown-property"

ERRORS = frozenset({UNSATISFIABLE, NEVER, UNKNOWN_PROPERTY})
"""Kinds of finding that make ``apply`` refuse a subscription it adds or whose filter it
changes (unless forced); the others are warnings."""

_FAMILY = {
    Family.STR: "text",
    Family.NUM: "number",
    Family.BOOL: "boolean",
    Family.DATETIME: "datetime",
}


@dataclass(frozen=True)
class Finding:
    """One problem of one subscription."""

    subscription: str
    kind: str
    """``unsatisfiable-group``, ``never-matches``, ``redundant-group``, ``duplicate``,
    ``dead`` or ``unknown-property``."""
    reason: str
    group: int | None = None
    """The group's position in the filter (1 is the first), when it is about one."""
    predicates: tuple[str, ...] = ()

    def __str__(self) -> str:
        where = self.subscription + (f", group {self.group}" if self.group else "")
        said = f" [{' and '.join(self.predicates)}]" if self.predicates else ""
        return f"{where}: {self.kind}: {self.reason}{said}"

    def as_json(self) -> dict[str, Any]:
        return {
            "subscription": self.subscription,
            "kind": self.kind,
            "group": self.group,
            "predicates": list(self.predicates),
            "reason": self.reason,
        }


class _Checked:
    """A filter with a witness (a message it matches) for each group that can match."""

    def __init__(self, filt: Filter) -> None:
        self.filter = filt
        self.witnesses = [witness(g.predicates) for g in filt.groups]
        self._groups = [tuple(compile_predicate(p) for p in g.predicates) for g in filt.groups]

    def matches(self, message: dict[str, Value]) -> bool:
        """Whether the filter matches ``message`` (normalised), as the reference says."""
        return any(all(check(message) for check in group) for group in self._groups)

    def live(self) -> list[tuple[int, Group, dict[str, Value]]]:
        return [
            (i, g, w)
            for i, (g, w) in enumerate(zip(self.filter.groups, self.witnesses, strict=True), 1)
            if w is not None
        ]

    def may_imply(self, other: _Checked) -> bool:
        """False when a witness of this filter is a message ``other`` does not match (so
        this filter does not imply it); True: only an exact check can tell."""
        return all(other.matches(w) for w in self.witnesses if w is not None)


def _holds(group: Group, message: dict[str, Value]) -> bool:
    return all(predicate_holds(p, message) for p in group.predicates)


def filter_findings(name: str, filt: Filter, checked: _Checked | None = None) -> list[Finding]:
    """Groups of one filter that never match or that another group covers."""
    checked = checked or _Checked(filt)
    found: list[Finding] = []
    for i, (group, w) in enumerate(zip(filt.groups, checked.witnesses, strict=True), start=1):
        if w is None:
            preds, why = _conflict(group)
            found.append(Finding(name, UNSATISFIABLE, why, i, preds))
    live = checked.live()
    if not live:
        found.append(Finding(name, NEVER, "no group of its filter can match any message"))
        return found
    for i, group, w in live:
        for j, other, v in live:
            if i == j or not _holds(other, w) or not implies(group, other):
                continue
            if j > i and _holds(group, v) and implies(other, group):
                continue  # the same group twice in other words: the later one is reported
            found.append(
                Finding(
                    name,
                    REDUNDANT,
                    f"every message it matches also matches group {j}; it can be removed",
                    i,
                    tuple(format_predicate(p) for p in group.predicates),
                )
            )
            break
    return found


def _conflict(group: Group) -> tuple[tuple[str, ...], str]:
    """The predicates of one property that no value passes together, and why."""
    by_property: dict[str, list[Predicate]] = {}
    for p in group.predicates:
        by_property.setdefault(p.property, []).append(p)
    for prop, preds in by_property.items():
        if satisfiable(preds):
            continue
        texts = tuple(format_predicate(p) for p in preds)
        ops = {p.op for p in preds}
        if Op.NOT_EXISTS in ops and len(ops) > 1:
            return texts, f"{prop} must be absent and present at once"
        families = _families(preds)
        if families is not None and len(families) > 1:
            named = " and ".join(sorted(_FAMILY[f] for f in families))
            return texts, f"{prop} is compared with two families ({named}); a value has one"
        return texts, f"no value of {prop} passes these together"
    return tuple(format_predicate(p) for p in group.predicates), "no message passes them together"


def _families(preds: Sequence[Predicate]) -> set[Family] | None:
    """The families the predicates each require, when each requires exactly one."""
    out: set[Family] = set()
    for p in preds:
        if p.op in (Op.EXISTS, Op.NOT_EXISTS):
            continue
        if p.op is Op.PREFIX:
            out.add(Family.STR)
        elif p.op is Op.BITWISE_AND:
            out.add(Family.NUM)
        elif p.op is Op.IN:
            kinds = {family(v) for v in p.value}
            if len(kinds) != 1:
                return None
            out |= kinds
        else:
            out.add(family(p.value))
    return out


def duplicates(
    subs: Sequence[tuple[str, str, Filter]], checked: dict[str, _Checked] | None = None
) -> list[Finding]:
    """Subscriptions of one service whose filters match the same messages: (name,
    service, filter) each; the later name is reported."""
    checked = checked if checked is not None else {}
    found: list[Finding] = []
    by_service: dict[str, list[tuple[str, Filter]]] = {}
    for name, service, filt in subs:
        by_service.setdefault(service, []).append((name, filt))
    for service, items in by_service.items():
        if len(items) < 2:
            continue
        for name, filt in items:
            if name not in checked:
                checked[name] = _Checked(filt)
        for k, (name, _) in enumerate(items):
            mine = checked[name]
            for first, _ in items[:k]:
                theirs = checked[first]
                if not (mine.may_imply(theirs) and theirs.may_imply(mine)):
                    continue
                if equivalent(mine.filter, theirs.filter):
                    found.append(
                        Finding(
                            name,
                            DUPLICATE,
                            f"matches exactly the messages {first!r} matches, for the same "
                            f"service {service!r}: each message is delivered to it twice",
                        )
                    )
                    break
    return found


ENGINE_NAMESPACES = ("messagebox.", "ErrorReport.")
"""Properties the engine and receive ports promote (``messagebox.ReceivePortName``,
``ErrorReport.FailureCode``…): known before any stored message carries them."""


def property_findings(subs: Sequence[tuple[str, Filter]], known: Collection[str]) -> list[Finding]:
    """The property names filters test that none of ``known`` (the names stored messages
    carry) is, with the nearest known name; a name the filter tests as absent
    (``not_exists``) and the engine's own (:data:`ENGINE_NAMESPACES`) are not reported."""
    found: list[Finding] = []
    have = set(known)
    for name, filt in subs:
        for prop in sorted(filt.properties - have):
            if prop.startswith(ENGINE_NAMESPACES) or any(
                p.property == prop and p.op is Op.NOT_EXISTS
                for g in filt.groups
                for p in g.predicates
            ):
                continue  # the engine's own, or testing that it is absent is the point
            found.append(
                Finding(
                    name,
                    UNKNOWN_PROPERTY,
                    f"no stored message carries {prop!r}{did_you_mean(prop, have)}",
                )
            )
    return found


@dataclass
class Traffic:
    """What a read of stored messages found: how many, the property names they carry,
    and the subscriptions that matched one of them."""

    messages: int = 0
    carried: set[str] = field(default_factory=set)
    matched: set[str] = field(default_factory=set)


def read_traffic(
    subs: Sequence[tuple[str, Filter]], pages: Iterable[Sequence[tuple[Any, Mapping[str, Value]]]]
) -> Traffic:
    """Route stored messages (pages of (id, promoted properties)) against ``subs``."""
    index: FilterIndex[str] = FilterIndex()
    index.update(subs)
    seen = Traffic()
    for page in pages:
        for _, props in page:
            seen.messages += 1
            seen.carried.update(props)
            seen.matched |= index.match(props)
    return seen


def dead_findings(subs: Sequence[tuple[str, Filter]], traffic: Traffic) -> list[Finding]:
    """The subscriptions that matched none of the messages read (none when none was)."""
    if not traffic.messages:
        return []
    return [
        Finding(
            name,
            DEAD,
            f"matched none of the {traffic.messages:,} stored message(s) of the window: "
            + format_filter(filt),
        )
        for name, filt in subs
        if name not in traffic.matched
    ]


def subscription_findings(
    made: Sequence[tuple[str, str, Filter]], others: Sequence[tuple[str, str, Filter]]
) -> list[Finding]:
    """Findings about some subscriptions: their filters, and whether an earlier one of
    ``others`` (every subscription of their services, in id order) matches the same
    messages."""
    checked = {name: _Checked(filt) for name, _, filt in made}
    found = [f for name, _, filt in made for f in filter_findings(name, filt, checked[name])]
    services = {service for _, service, _ in made}
    mine = {name for name, _, _ in made}
    # in the order given (by id: the later subscription is the duplicate)
    known = {name for name, _, _ in others}
    rest = [s for s in others if s[1] in services] + [m for m in made if m[0] not in known]
    for dup in duplicates(rest, checked):
        if dup.subscription in mine:
            found.append(dup)
    return found


def config_findings(subs: Sequence[tuple[str, str, Filter]]) -> list[Finding]:
    """Every finding that needs no traffic, for (name, service, filter) each."""
    checked = {name: _Checked(filt) for name, _, filt in subs}
    found = [f for name, _, filt in subs for f in filter_findings(name, filt, checked[name])]
    return found + duplicates(subs, checked)


@dataclass(frozen=True)
class Verdict:
    """Lint findings about a configuration to apply: ``errors`` refuse it (unless
    forced), ``warnings`` are said."""

    errors: tuple[Finding, ...] = ()
    warnings: tuple[Finding, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "errors": [f.as_json() for f in self.errors],
            "warnings": [f.as_json() for f in self.warnings],
        }


def verdict(findings: Iterable[Finding], new: Collection[str]) -> Verdict:
    """Findings sorted into errors and warnings: an error is one of the :data:`ERRORS`
    kinds about a subscription of ``new`` (added, or its filter changed); what is live
    already and unchanged is warned about, not refused again."""
    errors: list[Finding] = []
    warnings: list[Finding] = []
    for f in findings:
        (errors if f.kind in ERRORS and f.subscription in new else warnings).append(f)
    return Verdict(tuple(errors), tuple(warnings))
