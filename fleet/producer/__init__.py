"""The producer: read and validate the input, cut it into chunk objects, enqueue what is missing.

The store, not the broker, is the source of truth, so everything here can be rerun: a
second `fleet enqueue` finds the chunks already written and enqueues only unfinished ones.
"""
