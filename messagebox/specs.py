"""Names and subscription specs as given, checked: what :meth:`MessageBox.subscribe`,
a routing file and a host app's declarations take, refused before anything is stored.
Storing them is :mod:`messagebox.config.catalog`'s and :mod:`messagebox.storage.subscriptions`'; no
SQL here, so a host checks its subscriptions when they are declared without importing
storage."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from messagebox.errors import ValidationError
from messagebox.models import Kind, OnExpiry, OnFailure, State
from messagebox.predicates import Filter, to_filter
from messagebox.predicates.model import Op
from messagebox.properties import canonical_name, check_text


@dataclass(frozen=True)
class SubscriptionSpec:
    """A subscription to create (already validated)."""

    service: str
    host: str
    filter: Filter
    name: str | None
    kind: Kind
    instance_id: str | None
    priority: int
    state: State
    ordered: bool
    on_failure: OnFailure = OnFailure.SUSPEND
    correlation: tuple[str, ...] = ()
    on_expiry: OnExpiry = OnExpiry.SUSPEND
    ordered_by: str | None = None


SPEC_FIELDS = frozenset(
    {
        "service",
        "host",
        "filter",
        "name",
        "kind",
        "instance_id",
        "priority",
        "state",
        "ordered",
        "on_failure",
        "on_expiry",
        "correlation",
        "ordered_by",
    }
)
"""What a subscription spec (a dict of ``subscribe``'s arguments) may give."""


def check_name(what: str, name: object) -> str:
    """A host, service or subscription name, checked (docs/reference.md: Names): a str
    of 1 to 256 characters, without whitespace at either end, control or format characters
    (Unicode categories Cc, Cf, Cs, Co, Cn, Zl, Zp) or any of ``<>&"'`` and the backtick,
    so that a name printed on a terminal or a page cannot drive it."""
    import unicodedata

    if not isinstance(name, str) or not name.strip() or len(name) > 256:
        raise ValidationError(
            f"{what} name {name!r} must be a non-empty str of at most 256 characters"
        )
    try:
        check_text(name)  # PostgreSQL refuses NUL, every driver a lone surrogate
    except ValueError as exc:
        raise ValidationError(f"{what} name {name!r}: {exc}") from exc
    if name != name.strip():
        raise ValidationError(f"{what} name {name!r} starts or ends with whitespace")
    kinds = {
        "Cc": "control character",
        "Cf": "format character",
        "Cs": "surrogate",
        "Co": "private-use character",
        "Cn": "unassigned character",
        "Zl": "line separator",
        "Zp": "paragraph separator",
    }
    for at, char in enumerate(name):
        if char in "<>&\"'`":
            why = f"{char!r} (none of <>&\"'` is allowed)"
        elif (kind := kinds.get(unicodedata.category(char))) is not None:
            why = f"the {kind} {ascii(char)[1:-1]}"
        else:
            continue
        raise ValidationError(f"{what} name {name!r} has {why} at index {at}")
    return name


def _correlation(index: int | str, service: str, names: object) -> tuple[str, ...]:
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise ValidationError(
            f"subscription {index} of {service!r}: correlation must be a list of property names"
        )
    checked = []
    for name in names:
        try:
            checked.append(canonical_name(name))
        except (ValueError, TypeError) as exc:
            raise ValidationError(
                f"subscription {index} of {service!r}: correlation property {name!r}: {exc}"
            ) from exc
    if len(set(checked)) != len(checked):
        raise ValidationError(
            f"subscription {index} of {service!r}: a correlation property is given twice"
        )
    return tuple(checked)


def _fields(index: int | str, args: Mapping[str, Any]) -> dict[str, Any]:
    """The spec's enumerated and named fields, checked."""
    unknown = set(args) - SPEC_FIELDS
    if unknown:
        raise ValidationError(f"subscription {index}: unknown field {sorted(unknown)[0]!r}")
    try:
        service = check_name("service", args.get("service"))
        host = check_name("host", args.get("host"))
        name = args.get("name")
        if name is not None:
            check_name("subscription", name)
        return {
            "service": service,
            "host": host,
            "name": name,
            "kind": Kind(args.get("kind", Kind.ACTIVATION)),
            "state": State(args.get("state", State.STARTED)),
            "on_failure": OnFailure(args.get("on_failure", OnFailure.SUSPEND)),
            "on_expiry": OnExpiry.of(args.get("on_expiry", OnExpiry.SUSPEND)),
        }
    except ValueError as exc:
        raise ValidationError(f"subscription {index}: {exc}") from exc


def check_spec(index: int | str, spec: Mapping[str, Any]) -> SubscriptionSpec:
    """One subscription spec, validated (errors name it by ``index``, its position or
    its name as a ``repr``, and service)."""
    args = dict(spec)
    fields = _fields(index, args)
    service, kind = fields["service"], fields["kind"]
    instance_id = args.get("instance_id")
    priority = args.get("priority", 0)
    if instance_id is not None:
        try:
            check_text(str(instance_id))
        except ValueError as exc:
            raise ValidationError(
                f"subscription {index} of {service!r}: instance_id {instance_id!r}: {exc}"
            ) from exc
    correlation = _correlation(index, service, args.get("correlation") or ())
    if kind is Kind.ACTIVATION and instance_id is not None:
        raise ValidationError(
            f"subscription {index} of {service!r}: only instance subscriptions take an instance_id"
        )
    if kind is Kind.INSTANCE and (instance_id is None) == (not correlation):
        raise ValidationError(
            f"subscription {index} of {service!r}: an instance subscription needs "
            "either an instance_id or a correlation (not both)"
        )
    if type(priority) is not int or not -1000 <= priority <= 1000:
        raise ValidationError(f"subscription {index}: priority must be an int in -1000..1000")
    filt = to_filter(args.get("filter"))
    ordered = bool(args.get("ordered", False))
    ordered_by = _ordered_by(index, service, args.get("ordered_by"), filt)
    if ordered_by is not None and (ordered or kind is Kind.INSTANCE or correlation):
        what = (
            "ordered=True (one order for the whole subscription)"
            if ordered
            else ("an instance subscription" if kind is Kind.INSTANCE else "a correlation")
        )
        raise ValidationError(
            f"subscription {index} of {service!r}: ordered_by {ordered_by!r} cannot go with "
            f"{what}: "
            + (
                "give one of them"
                if ordered
                else "its service instance takes its messages one at a time, in publish "
                "order, already"
            )
        )
    return SubscriptionSpec(
        **fields,
        filter=filt,
        instance_id=None if instance_id is None else str(instance_id),
        priority=priority,
        ordered=ordered,
        correlation=correlation,
        ordered_by=ordered_by,
    )


def _ordered_by(index: int | str, service: str, name: object, filt: Filter) -> str | None:
    """The property a subscription is ordered by, checked: a property name (canonical),
    that a message its filter matches can carry (not every group requires it absent)."""
    if name is None:
        return None
    try:
        prop = canonical_name(name)
    except (ValueError, TypeError) as exc:
        raise ValidationError(f"subscription {index} of {service!r}: ordered_by: {exc}") from exc
    if all(
        any(p.op is Op.NOT_EXISTS and p.property == prop for p in g.predicates) for g in filt.groups
    ):
        raise ValidationError(
            f"subscription {index} of {service!r}: ordered_by {prop!r}: no message its filter "
            f"matches carries it (every group requires {prop} to be absent), so there is no "
            "key to order by"
        )
    return prop
