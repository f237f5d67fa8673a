"""What ub prints to a terminal shows values as they are.

A value ub did not write itself (a move, a query's result, a model's name) is text, never
rich markup (``[check]`` and ``x[col 3]`` vanished from ``ub sql``'s cells, ``[/fold]`` crashed
it) nor an emoji code, and no control character in it reaches the terminal: ESC and the C1
codes start sequences that retitle a window, move the cursor or hide what follows, so each is
shown as its escape (``\\x1b``).
"""

from __future__ import annotations

import re

from rich.markup import escape
from rich.text import Text

# C0 but tab and newline, DEL, C1 (0x9b is a CSI of its own)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(value: object) -> str:
    """``str(value)`` with each control character shown as its escape."""
    return _CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", str(value))


def shown(value: object) -> Text:
    """A table cell or line part showing ``value`` as it is (no markup, no emoji codes)."""
    return Text(printable(value))


def in_markup(value: object) -> str:
    """``value`` as it is, inside a line of rich markup ub writes around it."""
    return escape(printable(value))


def counted(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless it is one: ``1 round``, ``32 rounds``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
