"""``manage.py simbackend``: run the OpenAI-compatible backend simulator until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from simulator.server import SimulatorConfig, SimulatorServer, serve


def _parse_statuses(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise CommandError(f"--error-statuses must be comma-separated status codes, got {text!r}") from None


class Command(BaseCommand):
    help = "Run the OpenAI-compatible backend simulator (latency, token speed, errors, vLLM-style /metrics)."

    def add_arguments(self, parser: CommandParser) -> None:
        defaults = SimulatorConfig()
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8100)
        parser.add_argument("--model", default=defaults.model)
        parser.add_argument("--latency-ms", type=float, default=defaults.latency_ms, help="median latency")
        parser.add_argument(
            "--latency-sigma", type=float, default=defaults.latency_sigma, help="lognormal spread; 0 = fixed"
        )
        parser.add_argument(
            "--tokens-per-second", type=float, default=defaults.tokens_per_second, help="0 = instant"
        )
        parser.add_argument("--completion-tokens", type=int, default=defaults.default_completion_tokens)
        parser.add_argument("--error-rate", type=float, default=defaults.error_rate, help="0..1")
        parser.add_argument(
            "--error-statuses",
            default=",".join(str(s) for s in defaults.error_statuses),
            help="comma-separated statuses drawn from when an error is injected, e.g. 429,500,503",
        )
        parser.add_argument("--max-running", type=int, default=defaults.max_running, help="0 = unlimited")
        parser.add_argument("--seed", type=int, default=None)

    def build_config(self, options: dict[str, Any]) -> SimulatorConfig:
        if not 0 <= options["port"] <= 65535:
            raise CommandError(f"--port must be between 0 and 65535, got {options['port']}")
        try:
            return SimulatorConfig(
                model=options["model"],
                latency_ms=options["latency_ms"],
                latency_sigma=options["latency_sigma"],
                tokens_per_second=options["tokens_per_second"],
                default_completion_tokens=options["completion_tokens"],
                error_rate=options["error_rate"],
                error_statuses=_parse_statuses(options["error_statuses"]),
                max_running=options["max_running"],
                seed=options["seed"],
            )
        except ValueError as exc:
            raise CommandError(f"invalid simulator configuration: {exc}") from exc

    def handle(self, *args: Any, **options: Any) -> None:
        config = self.build_config(options)
        server = SimulatorServer(config, host=options["host"], port=options["port"])
        try:
            asyncio.run(serve(server))
        except OSError as exc:
            raise CommandError(f"cannot listen on {options['host']}:{options['port']}: {exc}") from exc
        except KeyboardInterrupt:
            pass
