"""Parquet input, local or s3:// (docs/architecture.md, Records): the columns are JSONL's
keys (`id`, one of `messages` / `prompt` / `input_ids` / `conversations` as Hugging Face
writes them, a `sampling` struct, any other column passed through), each row one record.

Rows are read a batch at a time from the row groups (`ParquetFile.iter_batches`), so
memory stays flat in the file's size. A null cell, top level or inside a struct, means the
field is unset: Parquet has one schema for all rows, so a row without a form or a sampling
field holds a null there where a JSONL line would leave the key out.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from fleet.errors import InputError
from fleet.producer.formats.base import InputFormat, Parsed
from fleet.producer.reader import BadLine, parse_object
from fleet.records import InputRecord

#: rows turned into Python objects at once: a few MB even for long conversations
BATCH_ROWS = 1024


class ParquetInput(InputFormat):
    unit = "row"
    suffixes = (".parquet", ".pq")
    magic = b"PAR1"

    def parsed(self, vocab: int | None = None, turns: str = "last") -> Iterator[Parsed]:
        try:
            parquet = pq.ParquetFile(self.path)
        except (pa.ArrowException, OSError) as e:
            raise InputError([f"{self.path}: not a readable Parquet file ({e})"], unit="file") from e
        with parquet:
            problems = [p for field in parquet.schema_arrow for p in _unsupported(field.type, field.name)]
            if problems:
                raise InputError(problems, unit="column")
            row = 0
            for batch in parquet.iter_batches(batch_size=BATCH_ROWS):
                for obj in batch.to_pylist():
                    row += 1
                    yield Parsed(row, _record(obj, row, vocab, turns))


def _record(obj: dict[str, Any], row: int, vocab: int | None, turns: str) -> tuple[InputRecord, str] | BadLine:
    problems: list[str] = []
    fields = _json_value(obj, "", problems)
    if problems:
        return BadLine(problems)
    try:
        return parse_object(fields, row, row - 1, vocab, turns)
    except BadLine as bad:
        return bad


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
