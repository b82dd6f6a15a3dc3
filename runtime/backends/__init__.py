"""Backend calls and health: the OpenAI-compatible adapter, circuit breakers and credential redaction."""
