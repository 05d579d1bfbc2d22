"""The text form of a filter, for the command line and the console; parsed, never eval'd.

    orders.Region == "EU" and orders.Total >= 100 or orders.Audit exists

Grammar (``and`` binds tighter than ``or``; keywords are case-insensitive)::

    filter    := group ("or" group)*
    group     := term ("and" term)*
    term      := "(" filter ")" | predicate
    predicate := NAME ("==" | "!=" | ">" | ">=" | "<" | "<=") VALUE
               | NAME "in" "[" VALUE ("," VALUE)* "]"
               | NAME "prefix" STRING
               | NAME "bitwise_and" INT
               | NAME "exists" | NAME "not_exists"
    VALUE     := STRING | INT | FLOAT | "true" | "false" | "datetime" "(" STRING ")"

- ``NAME`` is a property name, ``namespace.Name``;
- ``STRING`` is a JSON string (double quotes, JSON escapes);
- a number without ``.`` or an exponent is an ``int`` (``100``), with one a ``float``
  (``100.0``, ``1e3``): they compare equal, as everywhere, but keep their types;
- ``datetime("2024-05-01T10:00:00+02:00")`` is an aware datetime (an offset or ``Z`` is
  required);
- parentheses nest at most :data:`~messagebox.predicates.model.MAX_NESTING` levels deep;
- the text is read in time linear in its length: more terms joined by ``or`` or ``and``,
  values in a list, or predicates in all, than four times the model's limits (which
  count after duplicates are removed) are refused at once, before the rest is read.

:func:`format_filter` writes a :class:`~messagebox.predicates.Filter` in this form, and
``parse_filter(format_filter(f)) == f`` for every filter. Errors are
:class:`~messagebox.errors.FilterValidationError` naming the column.
"""

from __future__ import annotations

import json
import re
from datetime import datetime

from messagebox.errors import FilterValidationError
from messagebox.predicates.dsl import And, Or, to_filter
from messagebox.predicates.model import (
    MAX_GROUPS,
    MAX_IN_GIVEN,
    MAX_NESTING,
    MAX_PREDICATES_PER_GROUP,
    PRE_DEDUP_FACTOR,
    Filter,
    Op,
    Predicate,
    in_list_too_long,
)
from messagebox.properties import Value

_NAME = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)+")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SPACE = re.compile(r"\s*")
_SYMBOL_OPS = {"==": Op.EQ, "!=": Op.NE, ">=": Op.GE, "<=": Op.LE, ">": Op.GT, "<": Op.LT}
_WORD_OPS = {
    "in": Op.IN,
    "prefix": Op.PREFIX,
    "bitwise_and": Op.BITWISE_AND,
    "exists": Op.EXISTS,
    "not_exists": Op.NOT_EXISTS,
}
OP_TEXT: dict[Op, str] = {op: text for text, op in (*_SYMBOL_OPS.items(), *_WORD_OPS.items())}
"""The text of each operator."""
_DECODER = json.JSONDecoder()
MAX_TEXT_PREDICATES = PRE_DEDUP_FACTOR * MAX_GROUPS * MAX_PREDICATES_PER_GROUP
"""Predicates a filter's text may hold, duplicates included (a filter has at most
``MAX_GROUPS`` groups of ``MAX_PREDICATES_PER_GROUP`` after they are removed)."""


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.depth = 0
        """Parentheses open around the current position."""
        self.predicates = 0
        """Predicates read so far."""

    # -- scanning --

    def fail(self, expected: str, at: int | None = None) -> FilterValidationError:
        pos = self.pos if at is None else at
        found = f"{self.text[pos : pos + 20]!r}" if pos < len(self.text) else "the end of the text"
        return FilterValidationError(
            f"filter text, column {pos + 1}: expected {expected}, found {found}"
        )

    def skip(self) -> None:
        self.pos = _SPACE.match(self.text, self.pos).end()  # type: ignore[union-attr]

    def peek_word(self) -> str | None:
        self.skip()
        m = _WORD.match(self.text, self.pos)
        return m.group().lower() if m else None

    def take(self, literal: str) -> bool:
        self.skip()
        if self.text.startswith(literal, self.pos):
            self.pos += len(literal)
            return True
        return False

    def take_word(self, word: str) -> bool:
        if self.peek_word() == word:
            self.pos += len(word)
            return True
        return False

    # -- grammar --

    def parse(self) -> Filter:
        self.skip()
        if self.pos == len(self.text):
            raise FilterValidationError("filter text is empty")
        expr = self.disjunction()
        self.skip()
        if self.pos != len(self.text):
            raise self.fail("'and', 'or' or the end of the filter")
        return to_filter(expr)

    def disjunction(self) -> object:
        parts = [self.conjunction()]
        while self.take_word("or"):
            if len(parts) == MAX_GROUPS * PRE_DEDUP_FACTOR:  # each part is a group at least
                raise self.too_many(len(parts), "groups joined by 'or'", MAX_GROUPS)
            parts.append(self.conjunction())
        return parts[0] if len(parts) == 1 else Or.of(*parts)

    def conjunction(self) -> object:
        parts = [self.term()]
        while self.take_word("and"):
            if len(parts) == MAX_PREDICATES_PER_GROUP * PRE_DEDUP_FACTOR:  # as many predicates
                raise self.too_many(
                    len(parts), "predicates joined by 'and' in a group", MAX_PREDICATES_PER_GROUP
                )
            parts.append(self.term())
        return parts[0] if len(parts) == 1 else And.of(*parts)

    def too_many(self, count: int, what: str, limit: int) -> FilterValidationError:
        """An error refusing the text at once, before the rest is parsed: ``count`` parts
        are ``PRE_DEDUP_FACTOR`` times the limit, which counts after duplicates are
        removed."""
        return FilterValidationError(
            f"filter text, column {self.pos + 1}: more than {count} {what}; at most "
            f"{limit} are allowed (after duplicates are removed)"
        )

    def term(self) -> object:
        if self.take("("):
            if self.depth == MAX_NESTING:  # refused before the parser recurses too deep
                raise FilterValidationError(
                    f"filter text, column {self.pos}: parentheses are nested more than "
                    f"{MAX_NESTING} levels deep"
                )
            self.depth += 1
            inner = self.disjunction()
            if not self.take(")"):
                raise self.fail("')'")
            self.depth -= 1
            return inner
        if not _NAME.match(self.text, self.pos) and self.peek_word() == "not":
            raise self.fail("a predicate ('not' is not supported: use != or not_exists)")
        return self.predicate()

    def predicate(self) -> Predicate:
        self.skip()
        start = self.pos
        if self.predicates == MAX_TEXT_PREDICATES:  # each is in a group at least once
            raise self.too_many(
                self.predicates, "predicates", MAX_GROUPS * MAX_PREDICATES_PER_GROUP
            )
        self.predicates += 1
        m = _NAME.match(self.text, self.pos)
        if not m:
            raise self.fail("a property name such as orders.Total")
        name = m.group()
        self.pos = m.end()
        op = self.operator(name)
        value: object = None
        if op is Op.IN:
            value = self.value_list(name, start)
        elif op not in (Op.EXISTS, Op.NOT_EXISTS):
            value = self.value(after=OP_TEXT[op])
        try:
            return Predicate(property=name, op=op, value=value)
        except FilterValidationError as exc:
            raise FilterValidationError(f"filter text, column {start + 1}: {exc}") from exc

    def operator(self, name: str) -> Op:
        self.skip()
        for text, op in _SYMBOL_OPS.items():
            if self.text.startswith(text, self.pos):
                self.pos += len(text)
                return op
        if self.text.startswith("=", self.pos):
            raise self.fail(f"an operator after {name} ('==', not '=')")
        word = self.peek_word()
        if word in _WORD_OPS:
            self.pos += len(word)
            return _WORD_OPS[word]
        raise self.fail(
            f"an operator after {name} (==, !=, >, >=, <, <=, in, prefix, bitwise_and, "
            "exists, not_exists)"
        )

    def value_list(self, name: str, start: int) -> list[Value]:
        if not self.take("["):
            raise self.fail("'[' starting the list of values after 'in'")
        values = [self.value(after="[")]
        while self.take(","):
            if len(values) == MAX_IN_GIVEN:  # refused before the rest is read
                raise FilterValidationError(
                    f"filter text, column {start + 1}: predicate {name} in [...]: "
                    + in_list_too_long(None)
                )
            values.append(self.value(after=","))
        if not self.take("]"):
            raise self.fail("',' or ']'")
        return values

    def value(self, *, after: str) -> Value:
        self.skip()
        text, pos = self.text, self.pos
        if text.startswith('"', pos):
            return self.string()
        m = _NUMBER.match(text, pos)
        if m:
            self.pos = m.end()
            if m.group(1) or m.group(2):
                return float(m.group())
            return int(m.group())
        word = self.peek_word()
        if word in ("true", "false"):
            self.pos += len(word)
            return word == "true"
        if word == "datetime":
            self.pos += len(word)
            if not self.take("("):
                raise self.fail("'(' after datetime")
            self.skip()
            start = self.pos
            if not text.startswith('"', start):
                raise self.fail('a quoted ISO datetime, e.g. datetime("2024-05-01T10:00:00Z")')
            raw = self.string()
            try:
                when = datetime.fromisoformat(raw)
            except ValueError:
                raise self.fail("an ISO 8601 datetime", at=start) from None
            if when.tzinfo is None:
                raise self.fail("a datetime with a time zone offset (or Z)", at=start)
            if not self.take(")"):
                raise self.fail("')' closing datetime(")
            return when
        if text.startswith("'", pos):
            raise self.fail('a value (strings are in double quotes: "EU")')
        if word in ("null", "none"):
            raise self.fail("a value (there is no null: test absence with not_exists)")
        raise self.fail(
            f'a value after {after!r} (a "string", a number, true, false or datetime(…))'
        )

    def string(self) -> str:
        try:
            value, end = _DECODER.raw_decode(self.text, self.pos)
        except json.JSONDecodeError as exc:
            raise self.fail(f"a well-formed JSON string ({exc.msg})") from None
        self.pos = end
        return str(value)


def parse_filter(text: str) -> Filter:
    """Parse the text form of a filter (see the module docstring)."""
    if not isinstance(text, str):
        raise FilterValidationError(f"filter text must be a str, not {type(text).__name__}")
    return _Parser(text).parse()


def format_value(value: Value) -> str:
    """A value in the text form: JSON strings, numbers, true/false, datetime("…")."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)  # always has "." or an exponent, so it reads back as a float
    if isinstance(value, datetime):
        return f'datetime("{value.isoformat()}")'
    return json.dumps(value, ensure_ascii=False)


def format_predicate(pred: Predicate) -> str:
    """One predicate in the text form."""
    if pred.op in (Op.EXISTS, Op.NOT_EXISTS):
        return f"{pred.property} {OP_TEXT[pred.op]}"
    if pred.op is Op.IN:
        return f"{pred.property} in [{', '.join(format_value(v) for v in pred.value)}]"
    return f"{pred.property} {OP_TEXT[pred.op]} {format_value(pred.value)}"


def format_filter(filt: Filter) -> str:
    """A filter in the text form; :func:`parse_filter` reads it back to an equal filter."""
    groups = [" and ".join(format_predicate(p) for p in g.predicates) for g in filt.groups]
    if len(groups) == 1:
        return groups[0]
    return " or ".join(
        f"({text})" if len(g.predicates) > 1 else text
        for text, g in zip(groups, filt.groups, strict=True)
    )
