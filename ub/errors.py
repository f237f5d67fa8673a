"""The one exception type users see.

Anything raised as :class:`UbError` is an expected, explainable failure (bad input, a missing file,
an unreachable endpoint). The CLI prints its message as a single line and exits non-zero, with no
traceback. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


class UbError(Exception):
    """A clear, actionable error: say what was wrong, where, and what to do."""


def settings_from_mapping(cls: type, data: Mapping[str, Any], section: str) -> Any:
    """A dataclass of settings from a mapping: unknown keys are an error listing the valid
    ones, then the instance's own ``validate()`` (when it has one) checks the values."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise UbError(f"unknown {section} setting(s) {', '.join(unknown)}; "
                      f"valid: {', '.join(sorted(names))}")
    settings = cls(**data)
    if hasattr(settings, "validate"):
        settings.validate()
    return settings
