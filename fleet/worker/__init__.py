"""The worker side: one process per GPU, one engine per process, K chunk slots sharing it."""
