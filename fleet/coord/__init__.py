"""Coordination in Redis: the Celery app, every key, a chunk's state (`chunks`: queued marker,
leases, lease clock, counters), the heartbeat, recovery and the one retry policy."""
