"""The audit: every record checked against its own token ids (decode, counts, where it ends), when
its chunk commits and again at export (docs/architecture.md, "Audit")."""
