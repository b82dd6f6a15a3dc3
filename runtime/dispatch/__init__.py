"""The dispatcher: its scheduling loop, the atomic queue operations it performs, execution and counters."""
