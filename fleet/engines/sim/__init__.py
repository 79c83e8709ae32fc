"""The sim engine: its settings (settings.py, a leaf), its engine and what fleet asks of it (spec.py)."""
