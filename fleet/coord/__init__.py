"""Coordination in Redis: the Celery app, every key, a chunk's state, one owner per
family (`leases`, `chunkqueue`, `counters`, `figures`), the heartbeat, recovery and the one retry policy."""
