"""Incremental detokenization, stop strings and per-step text batching (the detok process)."""
