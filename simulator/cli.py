"""The simulator's command-line options, defined once: ``python -m simulator`` and ``manage.py simbackend``
both add them with :func:`add_simulator_arguments`."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
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


def add_simulator_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds every simulator option, each with its help and its default, to ``parser``."""
    d = SimulatorConfig()
    add = parser.add_argument
    add("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    add("--port", type=_port, default=DEFAULT_PORT, help="TCP port, 0 = any free one (default: %(default)s)")
    add("--model", default=d.model, help="model name served by /v1/models (default: %(default)s)")
    add("--kind", choices=KINDS, default=d.kind, help="metric names of /metrics (default: %(default)s)")
    add(
        "--latency-ms",
        type=float,
        default=d.latency_ms,
        help="median latency before work (default: %(default)s)",
    )
    add(
        "--latency-jitter",
        "--latency-sigma",
        dest="latency_sigma",
        type=float,
        default=d.latency_sigma,
        help="lognormal sigma of the latency; 0 = fixed (default: %(default)s)",
    )
    add(
        "--ttft-ms",
        type=float,
        default=d.ttft_ms,
        help="time to first token after the latency (default: %(default)s)",
    )
    add("--itl-ms", type=float, default=d.itl_ms, help="delay between two tokens (default: %(default)s)")
    add(
        "--tokens-per-second",
        type=float,
        default=d.tokens_per_second,
        help="token speed instead of --itl-ms; 0 = instant (default: %(default)s)",
    )
    add(
        "--completion-tokens",
        type=int,
        default=d.default_completion_tokens,
        help="tokens per reply unless max_tokens is lower (default: %(default)s)",
    )
    add(
        "--max-running",
        type=int,
        default=d.max_running,
        help="calls running at once; 0 = unlimited (default: %(default)s)",
    )
    add(
        "--kv-cache-tokens",
        type=int,
        default=d.kv_cache_tokens,
        help="KV-cache capacity in tokens; 0 = unlimited (default: %(default)s)",
    )
    add(
        "--error-rate",
        type=float,
        default=d.error_rate,
        help="share of calls failing, 0..1 (default: %(default)s)",
    )
    add(
        "--error-statuses",
        type=_statuses,
        default=",".join(str(s) for s in d.error_statuses),
        help="statuses an injected error draws from, e.g. 500,503 (default: %(default)s)",
    )
    add(
        "--rate-limit-rate",
        type=float,
        default=d.rate_limit_rate,
        help="share of calls refused at once with 429 (default: %(default)s)",
    )
    add(
        "--retry-after",
        type=int,
        default=d.retry_after_s,
        help="Retry-After seconds of a 429 (default: %(default)s)",
    )
    add(
        "--hang-rate",
        type=float,
        default=d.hang_rate,
        help="share of calls never answered until the client leaves (default: %(default)s)",
    )
    add("--seed", type=int, default=None, help="random seed for reproducible runs (default: %(default)s)")


def config_from_options(options: Mapping[str, Any]) -> SimulatorConfig:
    """The config from parsed options (``vars(args)`` or a command's options).

    Raises ValueError naming every problem found.
    """
    return SimulatorConfig(
        model=options["model"],
        kind=options["kind"],
        latency_ms=options["latency_ms"],
        latency_sigma=options["latency_sigma"],
        ttft_ms=options["ttft_ms"],
        itl_ms=options["itl_ms"],
        tokens_per_second=options["tokens_per_second"],
        default_completion_tokens=options["completion_tokens"],
        max_running=options["max_running"],
        kv_cache_tokens=options["kv_cache_tokens"],
        error_rate=options["error_rate"],
        error_statuses=tuple(options["error_statuses"]),
        rate_limit_rate=options["rate_limit_rate"],
        retry_after_s=options["retry_after"],
        hang_rate=options["hang_rate"],
        seed=options["seed"],
    )
