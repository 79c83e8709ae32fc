"""What lives as long as one worker process: its context, engine host, watchdog, run slots,
store writer and spool, and the assist loop."""
