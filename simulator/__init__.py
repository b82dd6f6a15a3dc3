"""An OpenAI-compatible backend simulator: a development and test tool, not part of the engine."""
