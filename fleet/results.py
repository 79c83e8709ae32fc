"""Result objects: a stats header line, then one output record per sample in input order.

Written once per chunk (conditional put); the header lets `fleet status` count tokens
without reading every record twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fleet.layout import decode_lines, encode_lines, result_key
from fleet.store import Store

HEADER = "_fleet_result"


def encode_result(stats: dict[str, Any], rows: list[dict[str, Any]]) -> bytes:
    ordered = sorted(rows, key=lambda r: (r["pos"], r["sample"]))
    return encode_lines([{HEADER: 1, **stats}, *ordered])


def decode_result(data: bytes, what: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    rows = list(decode_lines(data, what))
    if not rows or HEADER not in rows[0]:
        return {}, rows
    header = dict(rows[0])
    header.pop(HEADER)
    return header, rows[1:]


def read_result(store: Store, job: str, index: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    key = result_key(job, index)
    return decode_result(store.get(key), key)


def iter_records(store: Store, job: str, indexes: list[int]) -> Iterator[dict[str, Any]]:
    for index in indexes:
        yield from read_result(store, job, index)[1]
