"""The one exception type users see.

Anything raised as :class:`UbError` is an expected, explainable failure (bad input, a missing file,
an unreachable endpoint). The CLI prints its message as a single line and exits non-zero, with no
traceback. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class UbError(Exception):
    """A clear, actionable error: say what was wrong, where, and what to do."""
