"""Parquet input, local or remote (docs/architecture.md, Records): the columns are JSONL's
keys (`id`, one of `messages` / `prompt` / `input_ids` / `conversations` as Hugging Face
writes them, a `sampling` struct, any other column passed through), each row one record
(fleet.producer.formats.columnar).

Rows are read a batch at a time from the row groups (`ParquetFile.iter_batches`), so
memory stays flat in the file's size.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from fleet.errors import InputError
from fleet.producer.formats.base import InputFormat
from fleet.producer.formats.columnar import BATCH_ROWS, check_schema, rows
from fleet.producer.reader import BadLine


class ParquetInput(InputFormat):
    unit = "row"
    suffixes = (".parquet", ".pq")
    magic = b"PAR1"

    def objects(self) -> Iterator[tuple[int, dict[str, Any] | BadLine]]:
        try:
            parquet = pq.ParquetFile(self.path)
        except (pa.ArrowException, OSError) as e:
            raise InputError([f"{self.path}: not a readable Parquet file ({e})"], unit="file") from e
        with parquet:
            check_schema(parquet.schema_arrow)
            yield from rows(parquet.iter_batches(batch_size=BATCH_ROWS))
