"""Connecting to Valkey: the client factory with its error tuple, and the embedded server."""
