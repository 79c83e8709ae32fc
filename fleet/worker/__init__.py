"""The worker side: one process per GPU or GPU group, one engine per process, K chunk slots sharing it."""
