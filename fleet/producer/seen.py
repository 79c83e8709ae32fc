"""Duplicate-id detection whose memory stays small for millions of ids."""

from __future__ import annotations

import hashlib
from array import array


class SeenIds:
    """Ids met so far, as 8-byte blake2b digests in an open-addressing table.

    12 bytes a slot (digest and first line in two parallel arrays, at most half full), so
    24 to 48 bytes an id, where a set of Python ints plus a dict of first lines costs
    over 100.
    """

    def __init__(self, capacity: int = 1 << 12):
        self._digests = array("Q", [0]) * capacity
        self._lines = array("I", [0]) * capacity
        self._mask = capacity - 1
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @staticmethod
    def digest(record_id: str) -> int:
        # surrogatepass: JSON may spell a lone surrogate ("\ud800"), which utf-8 refuses.
        raw = hashlib.blake2b(record_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        return int.from_bytes(raw, "little") or 1  # 0 marks an empty slot

    def add(self, record_id: str, line: int) -> int | None:
        """Remember `record_id` as first seen on `line`; if it was seen before, that line."""
        digest = self.digest(record_id)
        digests, mask = self._digests, self._mask
        i = digest & mask
        while (found := digests[i]) != 0:
            if found == digest:
                return self._lines[i]
            i = (i + 1) & mask
        digests[i], self._lines[i] = digest, line
        self._count += 1
        if 2 * self._count > mask:
            self._grow()
        return None

    def _grow(self) -> None:
        old = zip(self._digests, self._lines, strict=True)
        capacity = 2 * (self._mask + 1)
        self._digests = array("Q", [0]) * capacity
        self._lines = array("I", [0]) * capacity
        self._mask = capacity - 1
        digests, lines, mask = self._digests, self._lines, self._mask
        for digest, line in old:
            if digest:
                i = digest & mask
                while digests[i]:
                    i = (i + 1) & mask
                digests[i], lines[i] = digest, line
