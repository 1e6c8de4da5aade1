"""Per-iteration schedulers: shared mechanics plus swappable policies."""
