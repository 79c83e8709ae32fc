"""A throwaway redis-server for tests: fleet's LocalRedis in a temporary directory,
with a password, extra arguments or a redis.conf to start from."""

from __future__ import annotations

import tempfile
from pathlib import Path

from fleet.coord.localredis import LocalRedis


class RedisProc(LocalRedis):
    """`with RedisProc(password="pw") as r: r.url` -> a running redis-server, no persistence."""

    def __init__(self, password: str | None = None, extra_args: list[str] | None = None,
                 conf: Path | None = None) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="redisproc-")
        super().__init__(Path(self._tmp.name), persist=False, password=password,
                         extra_args=extra_args, conf=conf)

    def stop(self) -> None:
        super().stop()
        self._tmp.cleanup()
