"""Integrations of localargmax into inference engines (each an optional extra)."""
