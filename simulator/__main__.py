"""``python -m simulator``: run the OpenAI-compatible backend simulator until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import contextlib
import sys

from runtime import eventloop
from simulator.cli import add_simulator_arguments, config_from_options
from simulator.server import SimulatorServer, serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m simulator", description="OpenAI-compatible backend simulator"
    )
    add_simulator_arguments(parser)
    args = parser.parse_args(argv)
    try:
        config = config_from_options(vars(args))
    except ValueError as exc:
        parser.error(str(exc))
    try:
        with contextlib.suppress(KeyboardInterrupt):
            eventloop.run(serve(SimulatorServer(config, host=args.host, port=args.port)))
    except OSError as exc:
        print(f"simulator: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
