"""Scheduling policy: the pure DRR / FIFO scheduler and the request cost model (no I/O, no clock)."""
