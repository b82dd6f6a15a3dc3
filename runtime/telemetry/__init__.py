"""Telemetry: span attribute names, the dispatcher's spans and the tracer that ships them to history."""
