"""Operator tools besides monitoring: planning, pre-flight checks, `fleet doctor`, the one-machine `fleet run`."""
