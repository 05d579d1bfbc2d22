"""A small, strict JSONPath subset for promoting one value per property.

Supported: ``$`` then any of ``.name``, ``['name']`` / ``["name"]`` and ``[index]``
(negative counts from the end), e.g. ``$.order.lines[0].sku`` or ``$['order-id']``.
Wildcards, filters, slices and recursive descent are refused when the path is compiled:
a promoted property takes exactly one value, and a path that could select several
would hide an ambiguity.
"""

from __future__ import annotations

import re
from typing import Any

from messagebox.errors import ValidationError

_MISSING = object()

_TOKEN = re.compile(
    r"""\.(?P<name>[A-Za-z_][A-Za-z0-9_\-]*)
      | \[\s*(?P<index>-?\d+)\s*\]
      | \[\s*'(?P<sq>(?:[^'\\]|\\.)*)'\s*\]
      | \[\s*"(?P<dq>(?:[^"\\]|\\.)*)"\s*\]""",
    re.VERBOSE,
)


class JsonPath:
    """A compiled path; :meth:`find` returns the one value it selects, or ``MISSING``."""

    MISSING = _MISSING

    def __init__(self, path: str) -> None:
        if not isinstance(path, str) or not path.startswith("$"):
            raise ValidationError(f"JSON path {path!r} must start with '$'")
        steps: list[str | int] = []
        pos = 1
        while pos < len(path):
            m = _TOKEN.match(path, pos)
            if m is None:
                raise ValidationError(
                    f"JSON path {path!r}: cannot read {path[pos:]!r} (supported: .name, "
                    "['name'], [index]; wildcards, filters and slices are not)"
                )
            if m["name"] is not None:
                steps.append(m["name"])
            elif m["index"] is not None:
                steps.append(int(m["index"]))
            else:
                quoted = m["sq"] if m["sq"] is not None else m["dq"]
                steps.append(re.sub(r"\\(.)", r"\1", quoted))
            pos = m.end()
        self.path = path
        self.steps = tuple(steps)

    def find(self, document: Any) -> Any:
        node = document
        for step in self.steps:
            if isinstance(step, int):
                if not isinstance(node, list) or not -len(node) <= step < len(node):
                    return _MISSING
                node = node[step]
            else:
                if not isinstance(node, dict) or step not in node:
                    return _MISSING
                node = node[step]
        return node

    def __repr__(self) -> str:
        return f"JsonPath({self.path!r})"
