"""What the command line prints cannot drive the operator's terminal: control and format
characters in stored text (an old store's names, a service's error) come out escaped,
as ``\\x1b``, in tables (plain and rich), fields, lines and JSON."""

from __future__ import annotations

import io
import json
import re

import pytest

from messagebox.cli.terminal import Terminal, escape_controls

HOSTILE = "evil\x1b]0;owned\x07\x1b[2J\x9b31m\u202eexe\u2028"


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _raw_controls(text: str) -> list[str]:
    return [c for c in text if c in "\x1b\x07\x9b\u202e\u2028"]


@pytest.mark.parametrize("stream", [io.StringIO, _Tty], ids=["plain", "rich"])
def test_a_table_cell_is_printed_with_its_controls_escaped(stream: type[io.StringIO]) -> None:
    out = stream()
    Terminal(stdout=out, stderr=io.StringIO()).table(["name", "n"], [[HOSTILE, 1]], "none")
    printed = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())  # rich's own styles (bold)
    assert _raw_controls(printed) == []
    assert "\\x1b]0;owned\\x07\\x1b[2J\\x9b31m\\u202eexe\\u2028" in printed.replace("\n", "")


def test_a_table_keeps_its_columns_aligned_with_escapes() -> None:
    out = io.StringIO()
    Terminal(stdout=out, stderr=io.StringIO()).table(
        ["name", "state"], [["a\x1bb", "started"], ["plain", "stopped"]], "none"
    )
    header, first, second = out.getvalue().splitlines()
    assert first.index("started") == second.index("stopped") == header.index("STATE")


def test_lines_and_fields_escape_controls_but_keep_line_breaks() -> None:
    out = io.StringIO()
    terminal = Terminal(stdout=out, stderr=io.StringIO())
    terminal.say(f"host {HOSTILE}\nnext line\tafter a tab")
    terminal.fields([("error", f"first {HOSTILE}\nsecond")])
    printed = out.getvalue()
    assert _raw_controls(printed) == []
    assert "next line\tafter a tab" in printed
    assert "second" in printed.splitlines()[-1]


def test_json_output_escapes_controls_and_reads_back_the_same() -> None:
    out = io.StringIO()
    Terminal(json_output=True, stdout=out, stderr=io.StringIO()).emit({"name": HOSTILE})
    printed = out.getvalue()
    assert _raw_controls(printed) == []
    assert json.loads(printed) == {"name": HOSTILE}


def test_ordinary_text_is_left_as_it_is() -> None:
    text = "zürich 東京 a\\b ✓"
    assert escape_controls(text) == text
