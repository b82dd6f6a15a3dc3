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
        numbers = (  # option, type, default, what it sets
            ("--port", int, 8100, "port to listen on"),
            ("--latency-ms", float, defaults.latency_ms, "median latency"),
            ("--latency-sigma", float, defaults.latency_sigma, "lognormal spread of the latency; 0 = fixed"),
            ("--tokens-per-second", float, defaults.tokens_per_second, "completion token speed; 0 = instant"),
            (
                "--completion-tokens",
                int,
                defaults.default_completion_tokens,
                "tokens per completion, capped by the request's max_tokens",
            ),
            ("--error-rate", float, defaults.error_rate, "share of requests answered with an error, 0..1"),
            (
                "--max-running",
                int,
                defaults.max_running,
                "requests served at once, the rest wait; 0 = unlimited",
            ),
        )
        parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
        for option, kind, default, meaning in numbers:
            parser.add_argument(option, type=kind, default=default, help=f"{meaning} (default: %(default)s)")
        parser.add_argument(
            "--model", default=defaults.model, help="model name it serves and reports (default: %(default)s)"
        )
        parser.add_argument(
            "--error-statuses",
            default=",".join(str(s) for s in defaults.error_statuses),
            help="comma-separated statuses drawn from when an error is injected, e.g. 429,500,503 "
            "(default: %(default)s)",
        )
        parser.add_argument(
            "--seed", type=int, default=None, help="random seed for latency and errors (default: unseeded)"
        )

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
