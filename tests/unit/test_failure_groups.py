"""Failure groups without a database: a stored error read into its exception and the
handler's frames (:mod:`messagebox.ops.tracebacks`), messages masked, and the property that
matters to an operator: a group is one raise site whatever ids its messages carry, and
two raise sites are two groups even when their exception and text are the same."""

from __future__ import annotations

import re
import string
import traceback
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from messagebox.ops.failures import FailureRow, group_id, groups, mask
from messagebox.ops.tracebacks import Frame, read

AT = datetime(2026, 11, 24, 9, 30, tzinfo=UTC)
DISPATCH = (
    '  File "{root}/venv/lib/python3.11/site-packages/messagebox/hosts/handling.py", '
    "line {n}, in _deliver\n    service(d)\n"
)


def stored(root: str = "/srv/app", line: int = 17, exception: str = "KeyError: 'APAC'") -> str:
    """A traceback as a host instance stores it: dispatch, the service, its helper, the
    standard library."""
    return (
        "Traceback (most recent call last):\n"
        + DISPATCH.format(root=root, n=316)
        + f'  File "{root}/shop/services.py", line 42, in ship\n'
        "    tax = taxes.rate(order.region)\n"
        "          ^^^^^^^^^^^^^^^^^^^^^^^^\n"
        f'  File "{root}/shop/taxes.py", line {line}, in rate\n'
        "    return TABLE[region]\n"
        "           ~~~~~^^^^^^^^\n"
        '  File "/usr/lib/python3.11/collections/__init__.py", line 1121, in __getitem__\n'
        "    raise KeyError(key)\n"
        f"{exception}\n"
    )


def rows(*errors: str | None, reason: str = "delivery-failure") -> list[FailureRow]:
    return [FailureRow(i, reason, "ship", "shop", e, AT) for i, e in enumerate(errors, 1)]


# --- reading a stored error ---------------------------------------------------------


def test_a_traceback_is_read_as_its_exception_and_the_handlers_innermost_frames() -> None:
    error = read(stored(exception="KeyError: 'tax table has no entry for APAC'"))
    assert error.exception == "KeyError"
    assert error.message == "'tax table has no entry for APAC'"
    # the dispatching frame and the standard library's are not the handler's own
    assert error.where == (
        Frame("services.py", "ship", "tax = taxes.rate(order.region)"),
        Frame("taxes.py", "rate", "return TABLE[region]"),
    )


def test_line_numbers_and_where_the_code_is_deployed_do_not_change_the_place() -> None:
    here, there = read(stored()), read(stored(root="/opt/other/release-7", line=90))
    assert here.where == there.where


def test_a_chained_exception_is_read_from_its_last_traceback() -> None:
    first = stored(exception="json.decoder.JSONDecodeError: Expecting value: line 1 column 1")
    error = read(
        first + "\nThe above exception was the direct cause of the following exception:\n\n"
        "Traceback (most recent call last):\n"
        + DISPATCH.format(root="/srv/app", n=316)
        + '  File "/srv/app/shop/services.py", line 50, in ship\n'
        "    raise ValueError(f'order {o} is not JSON') from exc\n"
        "ValueError: order A17 is not JSON\n"
    )
    assert (error.exception, error.message) == ("ValueError", "order A17 is not JSON")
    assert error.where == (
        Frame("services.py", "ship", "raise ValueError(f'order {o} is not JSON') from exc"),
    )


@pytest.mark.parametrize(
    "dispatch",
    [DISPATCH, DISPATCH.replace("hosts/handling.py", "hosts/calls.py")],
    ids=["stored-before-parts", "hosts-calls"],
)
def test_an_app_installed_as_a_package_is_the_handlers_own_code(dispatch: str) -> None:
    root = "/srv/venv/lib/python3.11/site-packages"
    error = read(
        "Traceback (most recent call last):\n"
        + dispatch.format(root="/srv", n=316)
        + f'  File "{root}/shop/services.py", line 3, in ship\n    carrier.book(order)\n'
        f'  File "{root}/shop/carrier.py", line 9, in book\n    httpx.post(URL)\n'
        f'  File "{root}/httpx/_api.py", line 319, in post\n    return request(\n'
        "httpx.ConnectTimeout: timed out\n"
    )
    assert error.exception == "httpx.ConnectTimeout"
    assert [(f.file, f.function) for f in error.where] == [
        ("shop/services.py", "ship"),
        ("shop/carrier.py", "book"),
    ]


def test_a_send_ports_failure_is_placed_in_messageboxs_own_frames() -> None:
    error = read(
        "Traceback (most recent call last):\n"
        + DISPATCH.format(root="/srv", n=316)
        + '  File "/srv/venv/lib/python3.11/site-packages/messagebox/hosts/ports.py", '
        "line 458, in send\n    where = self.adapters[which].send(out.body, outbound)\n"
        '  File "/srv/venv/lib/python3.11/site-packages/httpx/_api.py", line 319, in post\n'
        "ConnectionRefusedError: [Errno 111] Connection refused\n"
    )
    assert [f.file for f in error.where] == [
        "messagebox/hosts/handling.py",
        "messagebox/hosts/ports.py",
    ]


def test_a_traceback_cut_to_its_tail_still_has_its_frames() -> None:
    error = read(stored()[200:])  # the store keeps an error's last 8,000 characters
    assert error.exception == "KeyError"
    assert error.where[-1] == Frame("taxes.py", "rate", "return TABLE[region]")


@pytest.mark.parametrize(
    ("error", "exception", "message"),
    [
        ("TimeoutError: the handler of service 'ship' did not return within 300 s", "TimeoutError",
         "the handler of service 'ship' did not return within 300 s"),
        ("its subscription was removed before it was delivered", None,
         "its subscription was removed before it was delivered"),
        (None, None, ""),
        ("RuntimeError: needs an approval", "RuntimeError", "needs an approval"),
    ],
)  # fmt: skip
def test_an_error_without_a_traceback_is_its_last_line(
    error: str | None, exception: str | None, message: str
) -> None:
    assert read(error) == (exception, message, ())


# --- masking ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "masked"),
    [
        ("unsupported currency 'JPY' for order A064109",
         "unsupported currency <value> for order <id>"),
        ("order B7", "order <id>"),
        ("'tax table has no entry for APAC'", "'tax table has no entry for APAC'"),
        ("refused 01a217ef-32b2-77d5-8f9f-d22df383070d", "refused <id>"),
        ("KeyError 'orders.Total'", "KeyError <value>"),
        ("after 2.5 s at 0xdeadbeef", "after <n> s at <hex>"),
        ("bad hash a3f9c2d1e8 for row 17", "bad hash <id> for row <n>"),
        ("needs an approval above 1000", "needs an approval above <n>"),
    ],
)  # fmt: skip
def test_what_varies_is_masked_and_words_are_kept(message: str, masked: str) -> None:
    assert mask(message) == masked


# --- grouping -----------------------------------------------------------------------


def test_one_raise_site_is_one_group_whatever_its_messages() -> None:
    found = groups(
        rows(
            stored(exception="KeyError: 'tax table has no entry for APAC'"),
            stored(exception="KeyError: 'tax table has no entry for EMEA'", line=18),
            stored(exception="KeyError: 'APAC'", root="/opt/app"),
        )
    )
    assert [(g.count, g.exception, g.entry_ids) for g in found] == [(3, "KeyError", [1, 2, 3])]
    [g] = found
    assert g.example == "KeyError: 'tax table has no entry for APAC'"  # the first (newest)
    assert (g.example_entry, g.message) == (1, "'tax table has no entry for APAC'")


def test_errors_without_a_traceback_group_by_their_masked_message() -> None:
    found = groups(
        rows(
            "TimeoutError: no answer for order A064109 after 30.5 s",
            "TimeoutError: no answer for order 17 after 3 s",
            "TimeoutError: no answer for order B7 after 1e3 s",
            "TimeoutError: no answer from the carrier",
            None,
            None,
        )
    )
    assert sorted(g.count for g in found) == [1, 2, 3]
    assert found[0].message == "no answer for order <id> after <n> s"


def test_a_group_is_also_its_reason_and_service() -> None:
    error = stored()
    found = groups(
        [
            FailureRow(1, "delivery-failure", "ship", "shop", error, AT),
            FailureRow(2, "delivery-failure", "bill", "shop", error, AT),
            FailureRow(3, "subscription-removed", "ship", "shop", error, AT),
        ]
    )
    assert len(found) == 3


def test_a_group_id_is_a_hash_of_its_key() -> None:
    [g] = groups(rows(stored()))
    place = "\x1e".join("\x1d".join(f) for f in g.where)
    assert g.id == group_id("delivery-failure", "ship", "KeyError", place)
    assert re.fullmatch(r"[0-9a-f]{16}", g.id)


# --- the property: ids do not split a group, raise sites do --------------------------


def reserve(text: str) -> None:
    raise LookupError(text)


def charge(text: str) -> None:
    raise LookupError(text)  # the same exception and text as reserve's: another place


def raised(site: Callable[[str], None], text: str) -> str:
    """The traceback ``site`` leaves, as a host instance would store it."""
    try:
        site(text)
    except LookupError as exc:
        return "".join(traceback.format_exception(exc))
    raise AssertionError("it did not raise")


WORDS = st.text(alphabet=string.ascii_letters, min_size=1, max_size=8)
IDS = st.one_of(
    st.uuids().map(str),
    st.from_regex(r"[A-Z]{1,3}[0-9]{1,9}", fullmatch=True),  # A064109, B7
    st.from_regex(r"[0-9a-f]{0,8}[0-9][0-9a-f]{0,8}", fullmatch=True),  # hex, or a number
    st.integers(-(10**12), 10**12).map(str),
    st.floats(0, 1e9, allow_nan=False).map(lambda f: f"{f:.3g}"),
    st.from_regex(r"[A-Za-z0-9_.]{0,12}", fullmatch=True).map(lambda v: f"'{v}'"),
    st.from_regex(r"0x[0-9a-fA-F]{1,16}", fullmatch=True),
)
SEPARATORS = st.sampled_from([" ", ", ", ": ", " / ", " ("])
SHAPES = st.lists(st.tuples(st.one_of(WORDS, st.none()), SEPARATORS), min_size=1, max_size=8)


@st.composite
def alike(draw: st.DrawFn) -> tuple[str, str]:
    """Two messages of one shape: the same words, each with ids of its own."""
    shape = draw(SHAPES)
    return tuple(  # type: ignore[return-value]
        "".join(f"{word if word is not None else draw(IDS)}{sep}" for word, sep in shape).strip()
        for _ in range(2)
    )


@given(alike())
def test_messages_differing_by_ids_alone_are_one_group(messages: tuple[str, str]) -> None:
    spoken = groups(rows(*(f"ValueError: {m}" for m in messages)))
    assert len(spoken) == 1, [mask(m) for m in messages]
    traced = groups(rows(*(raised(reserve, m) for m in messages)))
    assert [g.count for g in traced] == [2]


@given(alike())
def test_two_raise_sites_are_two_groups_even_with_one_text(messages: tuple[str, str]) -> None:
    text = messages[0]
    found = groups(rows(raised(reserve, text), raised(charge, text), raised(reserve, messages[1])))
    assert sorted((g.count, g.where[-1].function) for g in found) == [(1, "charge"), (2, "reserve")]
    assert {g.where[-1].file for g in found} == {"test_failure_groups.py"}
