"""Chains, batches, job middleware and schedules, plugged into the engine as outcome hooks."""
