"""Columnar inputs (Parquet, Arrow): rows as the records their JSONL lines would be
(docs/architecture.md, Records). A null cell, top level or inside a struct, means the field is
unset: a columnar file has one schema for all rows, so a row without a form or a sampling field
holds a null there where a JSONL line would leave the key out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from fleet.errors import InputError
from fleet.producer.reader import BadLine

#: rows turned into Python objects at once: a few MB even for long conversations
BATCH_ROWS = 1024


def check_schema(schema: pa.Schema) -> None:
    """Refuse, by column, types JSON has no form for, before any row is read."""
    problems = [p for field in schema for p in _unsupported(field.type, field.name)]
    if problems:
        raise InputError(problems, unit="column")


def rows(batches: Iterable[pa.RecordBatch]) -> Iterator[tuple[int, dict[str, Any] | BadLine]]:
    """Each row's fields as its JSON line would hold them, numbered from 1, a bounded batch at a time."""
    row = 0
    for batch in batches:
        for start in range(0, batch.num_rows, BATCH_ROWS):
            for obj in batch.slice(start, BATCH_ROWS).to_pylist():
                row += 1
                problems: list[str] = []
                fields = _json_value(obj, "", problems)
                yield row, BadLine(problems) if problems else fields


def _json_value(value: Any, path: str, problems: list[str]) -> Any:
    """`value` as its JSON line would hold it: struct fields that are null left out, and a
    float JSON cannot write (NaN, infinity) reported, as the JSONL reader refuses it."""
    if isinstance(value, dict):
        return {k: _json_value(v, f"{path}.{k}" if path else k, problems) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_json_value(v, f"{path}[{i}]", problems) for i, v in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        problems.append(f"{path}: {value} is not a number JSON can hold")
    return value


def _unsupported(kind: pa.DataType, path: str) -> Iterator[str]:
    """Columns whose type has no JSON form (binary, timestamps, decimals, maps...), by path:
    a record must read the same from Parquet as from the JSONL line it would be."""
    if pa.types.is_struct(kind):
        for i in range(kind.num_fields):
            yield from _unsupported(kind.field(i).type, f"{path}.{kind.field(i).name}")
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        yield from _unsupported(kind.value_type, f"{path}[]")
    elif pa.types.is_dictionary(kind):
        yield from _unsupported(kind.value_type, path)
    elif not (
        pa.types.is_null(kind) or pa.types.is_boolean(kind) or pa.types.is_integer(kind)
        or pa.types.is_float32(kind) or pa.types.is_float64(kind)
        or pa.types.is_string(kind) or pa.types.is_large_string(kind)
    ):
        yield f"column {path}: type {kind} has no JSON form; cast it to a string or a number"
