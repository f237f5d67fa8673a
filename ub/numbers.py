"""Numbers read from text, in one place.

Every number ub parses from a string goes through :func:`parse_int` or :func:`parse_float`
(command-line arguments, ``ub model tiny --set`` values, a hosted actor's options, a port in a
URL or an address), and every mapping read from YAML (``--set`` values, config files) through
:func:`first_non_finite`. ``nan`` and ``inf`` pass every comparison, so a range check alone lets
them through to where they fail far from their cause (an HTTP client, an optimizer, a reward):
here they are refused with one line saying what was expected.

A leaf (no ub imports), so that the CLI's argument types stay instant.
"""

from __future__ import annotations

import math
import urllib.parse
from collections.abc import Mapping
from typing import Any

PORTS = (1, 65535)
"""The TCP ports a URL or an address may name."""


class NumberError(ValueError):
    """Text that is not the number asked for; the message says what was expected."""


def finite(value: float, shown: object = None) -> float:
    """``value`` if it is finite (``shown``: how the user wrote it, for the message)."""
    if not math.isfinite(value):
        raise NumberError("expected a finite number, got "
                          f"{shown if shown is not None else repr(value)}")
    return value


def _in_range(value: float, minimum: float | None, maximum: float | None) -> None:
    if minimum is not None and value < minimum:
        raise NumberError(f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise NumberError(f"must be <= {maximum}, got {value}")


def parse_int(text: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """A whole number from ``text``, within ``[minimum, maximum]`` where given."""
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise NumberError(f"expected a whole number, got {text!r}") from None
    _in_range(value, minimum, maximum)
    return value


def parse_float(text: str, minimum: float | None = None, maximum: float | None = None) -> float:
    """A finite number from ``text``, within ``[minimum, maximum]`` where given."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise NumberError(f"expected a number, got {text!r}") from None
    finite(value, repr(text))
    _in_range(value, minimum, maximum)
    return value


def parse_port(text: str) -> int:
    """A TCP port (1 to 65535) from ``text``."""
    try:
        return parse_int(text, *PORTS)
    except NumberError:
        raise NumberError(f"a port is a whole number from {PORTS[0]} to {PORTS[1]}, got "
                          f"{text!r}") from None


def url_port(url: str) -> int | None:
    """The port ``url`` names (``scheme://host:PORT/...``), read by :func:`parse_port`;
    ``None`` when it names none."""
    host = urllib.parse.urlsplit(url).netloc.rpartition("@")[2]
    if host.startswith("["):  # an IPv6 literal: [::1]:8000
        host = host.partition("]")[2]
    text = host.rpartition(":")[2] if ":" in host else ""
    return parse_port(text) if text else None


def first_non_finite(data: Any, where: str = "") -> tuple[str, float] | None:
    """The dotted key (``learner.algorithm_params.clip_eps``, list items by index) and value of
    the first ``nan`` or ``inf`` inside nested mappings and lists (YAML data), or ``None``."""
    if isinstance(data, float):
        return None if math.isfinite(data) else (where or "(top level)", data)
    items: Any = (data.items() if isinstance(data, Mapping)
                  else enumerate(data) if isinstance(data, list | tuple) else ())
    for key, value in items:
        found = first_non_finite(value, f"{where}.{key}" if where else str(key))
        if found:
            return found
    return None
