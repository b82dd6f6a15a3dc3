"""The engine of LLM Dispatch: importable and testable without Django.

Subpackages: ``wire`` (envelope, keys, published configuration), ``policy`` (scheduler, cost),
``dispatch`` (the dispatcher and its queue operations), ``backends`` (calls, breakers, redaction),
``telemetry`` (spans), ``valkey`` (connections). The producer client is :mod:`runtime.producer`;
the exception tree is :mod:`runtime.errors`; typed settings are :mod:`runtime.config`.
"""
