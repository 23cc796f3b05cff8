"""Per-row sufficient statistics and what is computed from their sums (no Ray here)."""
