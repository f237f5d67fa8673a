"""How ``ub sql`` prints a result: every row as CSV, or a table of the first rows, with nested
values (a MAP, a list, a struct) as JSON in both."""

from __future__ import annotations

import decimal
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from rich.text import Text

MAX_ROWS = 1000
"""The rows a table shows by default (``--max-rows``): the result streams, so a query of a
whole run prints what a terminal can show without holding the rest."""


def print_result(con, sql: str, fmt: str, max_rows: int = MAX_ROWS) -> None:
    """Print ``sql``'s result as it streams: every row as CSV, or a table of at most
    ``max_rows`` rows (the query stops there) and of the columns whose names fit the
    terminal's width whole (a line names the others)."""
    from ub.data.sql import stream_sql

    schema, batches = stream_sql(con, sql)
    show = [_shown_as(field.type) for field in schema]
    if fmt == "csv":
        import csv

        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(schema.names)
        for batch in batches:
            for row in batch.to_pylist():
                writer.writerow(["" if v is None else f(v)
                                 for f, v in zip(show, row.values(), strict=True)])
        return
    from rich.console import Console
    from rich.table import Table

    rows: list[list[Text]] = []
    more, cut = False, False
    for batch in batches:
        room = max_rows - len(rows)
        for row in batch.slice(0, room).to_pylist():
            values = [None if v is None else f(v)
                      for f, v in zip(show, row.values(), strict=True)]
            cut = cut or any(len(str(v)) > CELL_WIDTH for v in values)
            rows.append([_cell(v) for v in values])
        if batch.num_rows > room:  # (a row past the cap: the query stops here)
            more = True
            break
    shown = len(rows)
    console = Console()
    # A column is as narrow as its name and its longest word (rich wraps at spaces).
    narrowest = [max([len(name), *(len(word) for row in rows for word in row[i].plain.split())])
                 for i, name in enumerate(schema.names)]
    fits = fitting_columns(narrowest, console.width)
    view = Table(show_lines=False)
    for name, width in zip(schema.names[:fits], narrowest, strict=False):
        view.add_column(_cell(name), min_width=width)
    for row in rows:
        view.add_row(*row[:fits])
    console.print(view)
    if fits < len(schema.names):
        hidden = schema.names[fits:]
        print(f"({len(hidden)} more column{'s' if len(hidden) > 1 else ''} than "
              f"{console.width} characters hold: {', '.join(hidden)}; select fewer columns, "
              "widen the terminal, or use --format csv (.format csv in the shell))")
    if more:
        print(f"(the first {shown} rows; the query returns more, not fetched: "
              "add LIMIT/OFFSET, raise --max-rows, or use --format csv for every row)")
    else:
        print(f"({shown} row{'s' if shown != 1 else ''})")
    if cut:
        print(f"(values longer than {CELL_WIDTH} characters are cut, ending in …: --format "
              "csv writes them whole)")


CELL_WIDTH = 80
"""The characters a table cell shows of a value (a prompt is thousands)."""

COLUMN_EDGE = 3
"""A table column's characters besides its text: a border and a space each side."""


def fitting_columns(narrowest: list[int], width: int) -> int:
    """How many of the first columns, each at least as wide as ``narrowest`` says, fit a
    table of ``width`` characters (at least one): squeezed further, a terminal table shows
    columns of ``…`` and cut names."""
    used, count = 1, 0  # (the table's closing border)
    for least in narrowest:
        used += least + COLUMN_EDGE
        if used > width and count:
            break
        count += 1
    return count


def _shown_as(kind: pa.DataType) -> Callable[[Any], Any]:
    """How a column's (non-NULL) values of ``kind`` are printed: a plain scalar as it is (CSV
    is data for a pipe), a nested one (a MAP such as the ``runs`` view's ``settings``, a list,
    a struct) as JSON, in tables and CSV alike. Python's repr of Arrow's values printed a MAP
    as a list of pairs; DuckDB's own ``{key=value, ...}`` is readable but cannot be read back
    (a value holding ``, `` or ``=`` is ambiguous, as is NULL against the text NULL), while
    JSON says the same in a form every tool parses (``jq``, ``json.loads``, DuckDB's
    ``::JSON``). A MAP's entries keep their order (the ``runs`` view sorts its keys)."""
    import pyarrow as pa

    if not pa.types.is_nested(kind):
        return _as_it_is
    plain = _as_json_types(kind)
    return lambda value: json.dumps(plain(value), ensure_ascii=False, default=str)


def _as_it_is(value: Any) -> Any:
    return value


def _as_json_types(kind: pa.DataType) -> Callable[[Any], Any]:
    """A function from a value of ``kind`` (as Arrow's ``to_pylist`` gives it) to JSON's
    types, made once per column: a MAP (a list of (key, value) pairs there) becomes an object
    whose keys are text, a struct an object, a list an array."""
    import pyarrow as pa

    if pa.types.is_map(kind):
        key, item = _as_json_types(kind.key_type), _as_json_types(kind.item_type)

        def text(k: Any) -> str:  # (a JSON object's keys are text)
            return k if isinstance(k, str) else json.dumps(key(k), default=str)

        return _nullable(lambda pairs: {text(k): item(v) for k, v in pairs})
    if pa.types.is_struct(kind):
        fields = [(field.name, _as_json_types(field.type)) for field in kind]
        return _nullable(lambda value: {name: field(value.get(name)) for name, field in fields})
    if (pa.types.is_list(kind) or pa.types.is_large_list(kind)
            or pa.types.is_fixed_size_list(kind) or pa.types.is_list_view(kind)
            or pa.types.is_large_list_view(kind)):
        element = _as_json_types(kind.value_type)
        return _nullable(lambda values: [element(v) for v in values])
    if pa.types.is_decimal(kind):
        return _nullable(_decimal_number)
    return _as_it_is


def _nullable(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else convert(value)


def _decimal_number(value: decimal.Decimal) -> float | str:
    """A DECIMAL as a JSON number where a float holds it exactly, else as its text."""
    number = float(value)
    return number if decimal.Decimal(repr(number)) == value else str(value)


def _cell(value: object, width: int = CELL_WIDTH) -> Text:
    from ub.display import shown

    text = "NULL" if value is None else str(value)
    return shown(text if len(text) <= width else text[: width - 1] + "…")
