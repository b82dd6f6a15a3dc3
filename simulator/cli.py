"""The simulator's command-line options, defined once: ``python -m simulator`` and ``manage.py simbackend``
both add them with :func:`add_simulator_arguments`."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from simulator.config import KINDS, SimulatorConfig

DEFAULT_PORT = 8100


def _statuses(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated status codes, got {text!r}") from None


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port between 0 and 65535, got {text!r}")
    return port


@dataclass(frozen=True)
class Option:
    """One command-line option that sets one :class:`SimulatorConfig` field."""

    flags: tuple[str, ...]
    field: str
    help: str
    type: Callable[[str], Any] = float
    choices: tuple[str, ...] | None = None


CONFIG_OPTIONS = (
    Option(("--model",), "model", "model name served by /v1/models", str),
    Option(("--kind",), "kind", "whose metric names /metrics exports (openai: no /metrics)", str, KINDS),
    Option(("--latency-ms",), "latency_ms", "median latency before any work"),
    Option(
        ("--latency-jitter", "--latency-sigma"), "latency_sigma", "lognormal sigma of the latency; 0 = fixed"
    ),
    Option(("--ttft-ms",), "ttft_ms", "time to first token, after the latency"),
    Option(("--itl-ms",), "itl_ms", "delay between two tokens"),
    Option(("--tokens-per-second",), "tokens_per_second", "token speed instead of --itl-ms; 0 = instant"),
    Option(
        ("--completion-tokens",),
        "default_completion_tokens",
        "tokens per reply unless max_tokens is lower",
        int,
    ),
    Option(("--max-running",), "max_running", "calls running at once; 0 = unlimited", int),
    Option(("--kv-cache-tokens",), "kv_cache_tokens", "KV-cache capacity in tokens; 0 = unlimited", int),
    Option(("--error-rate",), "error_rate", "share of calls failing after their latency, 0..1"),
    Option(("--error-statuses",), "error_statuses", "statuses an injected error draws from", _statuses),
    Option(("--rate-limit-rate",), "rate_limit_rate", "share of calls refused at once with 429, 0..1"),
    Option(("--retry-after",), "retry_after_s", "Retry-After seconds of a 429", int),
    Option(("--hang-rate",), "hang_rate", "share of calls never answered until the client leaves, 0..1"),
    Option(("--seed",), "seed", "random seed for reproducible runs", int),
)


def add_simulator_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds every simulator option, each with its help and its default, to ``parser``."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument(
        "--port", type=_port, default=DEFAULT_PORT, help="TCP port, 0 = any free one (default: %(default)s)"
    )
    defaults = SimulatorConfig()
    for option in CONFIG_OPTIONS:
        default = getattr(defaults, option.field)
        if isinstance(default, tuple):  # shown, and parsed, as the command line writes it
            default = ",".join(str(item) for item in default)
        parser.add_argument(
            *option.flags,
            dest=option.field,
            type=option.type,
            choices=option.choices,
            metavar=None if option.choices else option.flags[0].removeprefix("--").upper().replace("-", "_"),
            default=default,
            help=f"{option.help} (default: %(default)s)",
        )


def config_from_options(options: Mapping[str, Any]) -> SimulatorConfig:
    """The config from parsed options (``vars(args)`` or a command's options).

    Raises ValueError naming every problem found.
    """
    return SimulatorConfig(**{option.field: options[option.field] for option in CONFIG_OPTIONS})
