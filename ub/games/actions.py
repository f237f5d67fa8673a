"""Action extraction: from a model's completion text to the action string the game receives.

Extractors return ``(action, format_ok)``. When the completion does not follow the requested
format, the raw text is passed to the game anyway (TextArena judges it, usually as an invalid
move) and ``format_ok`` is False so format rewards and metrics can see it.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from ub.errors import UbError

_BOXED = re.compile(r"\\boxed\{(.*?)\}", re.DOTALL)
_BRACKET = re.compile(r"\[([^\[\]]*)\]")


def extract_boxed(text: str) -> tuple[str, bool]:
    """The last ``\\boxed{...}``; its content is wrapped in brackets unless it has them already."""
    matches = _BOXED.findall(text)
    if not matches or not matches[-1].strip():
        return text.strip(), False
    answer = matches[-1].strip()
    return (answer if "[" in answer else f"[{answer}]"), True


def extract_bracket(text: str) -> tuple[str, bool]:
    """The last ``[...]`` in the text, brackets included."""
    matches = _BRACKET.findall(text)
    if not matches or not matches[-1].strip():
        return text.strip(), False
    return f"[{matches[-1].strip()}]", True


EXTRACTORS: dict[str, Callable[[str], tuple[str, bool]]] = {
    "boxed": extract_boxed,
    "bracket": extract_bracket,
}


def get_extractor(name: str) -> Callable[[str], tuple[str, bool]]:
    """Return the extractor called ``name`` or raise a :class:`UbError` listing the valid ones."""
    try:
        return EXTRACTORS[name]
    except KeyError:
        raise UbError(
            f"unknown action extractor {name!r}; choose one of: {', '.join(sorted(EXTRACTORS))}"
        ) from None
