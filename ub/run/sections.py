"""The settings sections not yet declared in the package that uses them (being moved there:
:mod:`ub.settings` has the base and the rules)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from ub.errors import UbError
from ub.seeding import DEFAULT_SEED
from ub.settings import (
    EXECUTION,
    Section,
    components_of,
    default_of,
    format_errors,
    is_execution,
    names_components,
)

__all__ = ["DEFAULT_SEED", "EXECUTION", "Section", "check_types", "components_of", "default_of",
           "format_errors", "is_execution", "names_components"]


def check_types(section: type[BaseModel], data: Mapping[str, Any], name: str) -> None:
    """(Until the mirrors go.) Check the types of the settings in ``data`` that ``section``
    has."""
    known = {k: v for k, v in data.items() if k in section.model_fields and v is not None
             and not dataclasses.is_dataclass(v)}
    try:
        section.model_validate(known)
    except ValidationError as exc:
        raise UbError(format_errors(exc, name)) from None
