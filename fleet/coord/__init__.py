"""Coordination in Redis: the Celery app, every key, leases, the queue, recovery and the one retry policy."""
