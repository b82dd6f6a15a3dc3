"""``manage.py simbackend``: run the OpenAI-compatible backend simulator until SIGINT/SIGTERM."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from runtime import eventloop
from simulator.cli import add_simulator_arguments, config_from_options
from simulator.config import SimulatorConfig
from simulator.server import SimulatorServer, serve


class Command(BaseCommand):
    help = (
        "Run the OpenAI-compatible backend simulator (latency, streaming, faults, a vLLM-like engine "
        "with vLLM/SGLang /metrics)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_simulator_arguments(parser)

    def build_config(self, options: dict[str, Any]) -> SimulatorConfig:
        try:
            return config_from_options(options)
        except ValueError as exc:
            raise CommandError(f"invalid simulator configuration: {exc}") from exc

    def handle(self, *args: Any, **options: Any) -> None:
        config = self.build_config(options)
        server = SimulatorServer(config, host=options["host"], port=options["port"])
        try:
            eventloop.run(serve(server))
        except OSError as exc:
            raise CommandError(f"cannot listen on {options['host']}:{options['port']}: {exc}") from exc
        except KeyboardInterrupt:
            pass
