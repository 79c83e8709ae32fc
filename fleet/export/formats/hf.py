"""A Hub-ready dataset folder (docs/architecture.md, Exports): Parquet shards
`data/train-00000-of-000NN.parquet` in the parquet export's schema, each closed once it holds
`shard_bytes` of rows (uncompressed), written a row group at a time (at most ROW_GROUP_ROWS rows or `row_group_bytes`),
so memory and file sizes stay bounded whatever the job's size. The dataset card (README.md) is
written beside them by fleet.export.card; `datasets.load_dataset(DIR)` reads the folder.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from fleet.export.formats.base import ExportRow, LeftOut
from fleet.export.formats.parquet import ParquetWriter
from fleet.store.manifest import Manifest

#: the Hub's own default for push_to_hub shards
SHARD_BYTES = 500 * 1000 * 1000
ROW_GROUP_BYTES = 64 * 1024 * 1024
#: rows of a row group at most: the Hub's viewer pages through row groups
ROW_GROUP_ROWS = 1000
SPLIT = "train"


def shard_name(index: int, total: int) -> str:
    return f"data/{SPLIT}-{index:05d}-of-{total:05d}.parquet"


class HfWriter(ParquetWriter):
    #: writes a folder, not a file (fleet.export.target.folder_target)
    folder = True

    def __init__(self, path: Path, manifest: Manifest, stable: bool, left_out: LeftOut,
                 shard_bytes: int | None = None, row_group_bytes: int | None = None):
        self.shard_bytes = shard_bytes or SHARD_BYTES
        self.row_group_bytes = row_group_bytes or ROW_GROUP_BYTES
        self.root = path
        (path / "data").mkdir(parents=True, exist_ok=True)
        self.shards: list[Path] = []
        self.pending: list[pa.Table] = []
        #: the current shard's rows in bytes, as Arrow holds them (the file, compressed, is smaller)
        self.held = 0
        super().__init__(self._next_shard(), manifest, stable, left_out)

    def _next_shard(self) -> Path:
        self.shards.append(self.root / "data" / f".{SPLIT}-{len(self.shards):05d}.parquet.tmp")
        return self.shards[-1]

    def write(self, rows: list[ExportRow]) -> int:
        table = self.table(rows)
        per_row = max(1, table.nbytes // max(1, table.num_rows))
        step = max(1, min(ROW_GROUP_ROWS, self.row_group_bytes // per_row))
        for start in range(0, table.num_rows, step):
            self.pending.append(table.slice(start, step))
            rows_held = sum(t.num_rows for t in self.pending)
            if rows_held >= ROW_GROUP_ROWS or sum(t.nbytes for t in self.pending) >= self.row_group_bytes:
                self._flush()
        return len(rows)

    def _flush(self) -> None:
        if not self.pending:
            return
        group = pa.concat_tables(self.pending)
        self.pending = []
        self.writer.write_table(group, row_group_size=group.num_rows)
        self.held += group.nbytes
        if self.held >= self.shard_bytes:
            self.held = 0
            self.writer.close()
            self.writer = pq.ParquetWriter(self._next_shard(), self.schema, compression="zstd")

    def close(self) -> None:
        self._flush()
        self.writer.close()
        if len(self.shards) > 1 and pq.ParquetFile(self.shards[-1]).metadata.num_rows == 0:
            self.shards.pop().unlink()  # the last shard was opened and got nothing
        for i, tmp in enumerate(self.shards):
            tmp.replace(self.root / shard_name(i, len(self.shards)))
