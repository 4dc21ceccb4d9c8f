"""Markdown for reports: every string from a run escaped on its way in, tables that cannot be split.

Every string that comes from a run (model, strategy, device, status, message, run and folder names,
env.json and config.json values) goes through :func:`md` or :func:`code`, so what rows contain can
neither break a table nor pass through as HTML.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Iterable, Sequence

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
#: Markdown's inline punctuation; ``_`` only where it could open or close emphasis (not inside a word)
_MD_SPECIAL = re.compile(r"[\\`*\[\]|~]|(?<![A-Za-z0-9_])_+|_+(?![A-Za-z0-9_])")
_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def visible(value: object) -> str:
    """``value`` as one line: control characters (newlines included) shown as escapes."""
    return _CONTROL.sub(lambda m: ascii(m.group())[1:-1], str(value))


def md(value: object) -> str:
    """A string from the rows as plain Markdown text: HTML characters as entities, Markdown's
    punctuation escaped, one line."""
    text = re.sub(r"[&<>]", lambda m: _HTML[m.group()], visible(value))
    return _MD_SPECIAL.sub(lambda m: "".join("\\" + c for c in m.group()), text)


def code(value: object) -> str:
    """A string from the rows as a Markdown code span (shown literally), fenced by more backticks than
    it holds; a ``|`` is escaped so that it cannot split a table cell. Text holding HTML's characters
    is given as :func:`md` text instead, so that no renderer can take it for markup."""
    if re.search(r"[&<>]", str(value)):
        return md(value)
    text = visible(value).replace("|", "\\|")
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or fence != "`" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def link(path: str) -> str:
    """A relative path as a link target: every character a URL does not allow literally, escaped."""
    return urllib.parse.quote(path, safe="/._-~")


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(escape_bars(str(c)) for c in row) + " |" for row in rows]
    return lines + [""]


def escape_bars(cell: str) -> str:
    """A cell's ``|`` escaped (for a table), leaving those already escaped (by :func:`md`, :func:`code`)."""
    return re.sub(r"(?<!\\)\|", r"\\|", cell)
