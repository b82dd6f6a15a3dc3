"""The wire contract: queued envelope and reply, every Valkey key name and TTL, published configuration."""
