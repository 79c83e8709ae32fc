"""kombu's Redis transport on the process's one pool (fleet.coord.pool).

kombu gives every channel two pools of its own: a worker's consumer, event dispatcher and
remote-control channels held six connections, three of them idle after their first command
(each channel's first PING, the remote-control queue's declaration). Here every channel's
short commands (acks, PUBLISHes, declarations, the first PING) go through the process's pool;
only what must have a connection of its own keeps one: the BRPOP, and the subscription.
"""

from __future__ import annotations

from typing import Any

import redis
from kombu.transport import redis as kombu_redis

from fleet.coord.pool import shared_pool


class SharedPoolChannel(kombu_redis.Channel):
    """A channel whose synchronous pool is the process's, and whose first PING uses it."""

    _pinging = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # kombu's Channel.__init__ PINGs through its asynchronous client (the BRPOP's); a
        # channel that never BRPOPs would keep that connection idle for its whole life.
        self._pinging = True
        try:
            super().__init__(*args, **kwargs)
        finally:
            self._pinging = False
            self.__dict__.pop("client", None)  # the synchronous client the PING used: the BRPOP's comes next

    def _shares(self) -> bool:
        # a TLS broker's options travel in kombu's own connection parameters: not shared
        return not self.connection.client.ssl

    def _create_client(self, asynchronous: bool = False) -> Any:
        return super()._create_client(asynchronous and not self._pinging)

    def _get_pool(self, asynchronous: bool = False) -> redis.ConnectionPool:
        if asynchronous or not self._shares():
            return super()._get_pool(asynchronous)
        # what kombu's own _get_pool sets as it builds its pool
        self.keyprefix_fanout = self.keyprefix_fanout.format(db=self._connparams()["db"])
        return shared_pool(self.connection.client.as_uri(include_password=True))

    def _disconnect_pools(self) -> None:
        # The shared pool is not this channel's to close: fleet's clients and the other channels use
        # it. A connection a lost broker broke is replaced when it is next taken from the pool.
        if self._shares():
            self._pool = None
        super()._disconnect_pools()


class SharedPoolTransport(kombu_redis.Transport):
    Channel = SharedPoolChannel
