"""Export formats, one module each, in one registry keyed by the `--format` name."""

from __future__ import annotations

from fleet.export.formats.base import ExportRow, LeftOut, Writer
from fleet.export.formats.hf import HfWriter
from fleet.export.formats.jsonl import VOLATILE_FIELDS, JsonlWriter
from fleet.export.formats.openai import OpenAIBatchWriter
from fleet.export.formats.parquet import ParquetWriter
from fleet.export.formats.specforge import SpecForgeWriter
from fleet.export.formats.tokens import TokensWriter

FORMATS: dict[str, type[Writer]] = {
    "jsonl": JsonlWriter,
    "parquet": ParquetWriter,
    "specforge": SpecForgeWriter,
    "tokens": TokensWriter,
    "openai": OpenAIBatchWriter,
    "hf": HfWriter,
}

__all__ = ["FORMATS", "VOLATILE_FIELDS", "ExportRow", "LeftOut", "Writer"]
