"""What lives for one chunk's run: the run's state, the task (read, generate, commit), the
executor and the middleware around it, and how the run ended."""
