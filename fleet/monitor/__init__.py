"""Monitoring: job status from the store and Redis, Prometheus metrics of the head, Flower."""
