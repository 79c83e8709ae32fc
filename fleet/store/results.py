"""Result objects: a stats header line, then one output record per sample in input order.

Written once per chunk (conditional put); the header lets `fleet status` count tokens
without reading every record twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fleet.store import Store
from fleet.store.layout import decode_lines, encode_lines, result_key

HEADER = "_fleet_result"


def cut_in_thinking(row: dict[str, Any]) -> bool:
    """A row stopped at max tokens before its think block closed: all reasoning, no answer."""
    return row.get("finish_reason") == "length" and row.get("reasoning") is not None and not row.get("output")


def chunk_stats(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What `fleet status` sums over result headers, computed once per chunk at commit.

    Truncation is counted here because a cut trace looks like a normal record until one
    reads its finish_reason (vllm-project/speculators#835 reported 0 cut where 35% were).
    """
    return {
        "samples": len(rows),
        "prompt_tokens": sum(r["prompt_tokens"] for r in rows),
        "completion_tokens": sum(r["completion_tokens"] for r in rows),
        "errors": sum(1 for r in rows if r["finish_reason"] == "error"),
        "records_truncated": sum(1 for r in rows if r["finish_reason"] == "length"),
        "records_truncated_in_thinking": sum(1 for r in rows if cut_in_thinking(r)),
        "retractions": sum(r.get("retractions") or 0 for r in rows),
    }


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
