"""What supervises a host's worker processes: the launcher, their process trees, dying with the parent."""
