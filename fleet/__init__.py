"""fleet: crash-proof batch LLM generation on a fleet of GPUs.

Data flows one way: producer -> broker (Redis, Celery) -> worker (engine) -> store -> status/export.
"""

__version__ = "0.1.0"
