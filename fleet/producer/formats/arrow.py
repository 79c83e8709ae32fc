"""Arrow input: the `.arrow` files `datasets`' `save_to_disk` writes (Arrow's IPC stream format,
record batches of about a thousand rows), or Arrow IPC files; rows as Parquet's are read
(fleet.producer.formats.columnar). The file is memory-mapped and read a batch at a time, so
memory stays flat in its size.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from fleet.errors import InputError
from fleet.producer.formats.base import InputFormat
from fleet.producer.formats.columnar import check_schema, rows
from fleet.producer.reader import BadLine

_FILE_MAGIC = b"ARROW1"


class ArrowInput(InputFormat):
    unit = "row"
    suffixes = (".arrow",)
    magic = _FILE_MAGIC

    def objects(self) -> Iterator[tuple[int, dict[str, Any] | BadLine]]:
        try:
            source = pa.memory_map(str(self.path))
            with self.path.open("rb") as f:
                is_file = f.read(6) == _FILE_MAGIC
            reader: Any = pa.ipc.open_file(source) if is_file else pa.ipc.open_stream(source)
        except (pa.ArrowException, OSError) as e:
            raise InputError([f"{self.path}: not a readable Arrow file ({e})"], unit="file") from e
        with source:
            check_schema(reader.schema)
            if is_file:
                yield from rows(reader.get_batch(i) for i in range(reader.num_record_batches))
            else:
                yield from rows(reader)
