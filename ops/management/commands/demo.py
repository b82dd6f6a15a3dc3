"""``manage.py demo``: everything on one machine, stopped together with Ctrl-C.

Embedded Valkey, the simulator, the demo fabric group, the web server (which owns the embedded
ClickHouse and runs the history ingester), the OpenAI-compatible ingress (``runingress``), a dispatcher
and the load generator.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ops.supervisor import Supervisor
from pools.connections import valkey_url
from runtime.valkey import embedded
from runtime.valkey.embedded import port_free

# The demo's backend: answers like a served model, about 250 ms to the first token and then one token
# every 30 ms (33 tokens/s, a usual decode speed for one request), so that a streamed answer visibly
# arrives token by token in curl or an SDK; whole answers (16 tokens) still take about 0.7 s.
DEMO_SIMULATOR_OPTIONS = (
    "--latency-ms", "250", "--latency-jitter", "0.5", "--itl-ms", "30", "--max-running", "24", "--seed", "7",
)  # fmt: skip


def wait_for_port(port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.1)
    return False


class Command(BaseCommand):
    help = (
        "Run the whole demo: dashboard on http://127.0.0.1:8000, simulator, dispatcher, history, load. "
        "A restart keeps the groups and pools as edited in the admin (only the demo group's endpoint "
        "follows the simulator); --reset restores the demo values."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=8000, help="web server port (default: %(default)s)")
        parser.add_argument(
            "--sim-port",
            type=int,
            default=8100,
            help="simulator port, a free one if it is taken (default: %(default)s)",
        )
        parser.add_argument(
            "--ingress-port",
            type=int,
            default=8001,
            help="port of the OpenAI-compatible /v1 ingress (runingress), a free one if it is taken "
            "(default: %(default)s)",
        )
        parser.add_argument("--no-load", action="store_true", help="do not start the load generator")
        parser.add_argument(
            "--load-scale",
            type=float,
            default=1.0,
            help="multiply the load generator's arrival rates (default: %(default)s)",
        )
        parser.add_argument(
            "--admin-password",
            default="admin",
            help="password of the superuser 'admin', created or reset at start (default: %(default)s)",
        )
        parser.add_argument(
            "--reset",
            action="store_true",
            help="restore the demo group and its pools to the demo values, undoing admin edits",
        )
        parser.add_argument(
            "--duration",
            type=float,
            default=0,
            help="stop after this many seconds, 0 = at Ctrl-C (default: %(default)s)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        port = options["port"]
        if not port_free(port):
            raise CommandError(f"port {port} is taken; stop what uses it or pass --port")
        data_dir = settings.DISPATCH_DATA_DIR
        had_valkey = settings.VALKEY_URL or embedded.running(data_dir) is not None
        url = valkey_url()
        self.stdout.write(f"Valkey: {url}{'' if settings.VALKEY_URL else ' (embedded)'}")
        call_command("migrate", verbosity=0)
        sim_port = options["sim_port"] if port_free(options["sim_port"]) else embedded.free_port()
        endpoint = f"http://127.0.0.1:{sim_port}/v1"
        ingress_port = options["ingress_port"]
        if ingress_port == port or not port_free(ingress_port):
            ingress_port = embedded.free_port()
        call_command(
            "seed_demo",
            endpoint=endpoint,
            admin_password=options["admin_password"],
            reset=options["reset"],
            verbosity=0,
        )
        env = {
            **os.environ,
            "VALKEY_URL": url,
            "DISPATCH_DATA_DIR": str(data_dir),
            "DJANGO_SETTINGS_MODULE": "dispatch_project.settings",
            "PYTHONUNBUFFERED": "1",
        }
        supervisor = Supervisor(data_dir / "logs", env)
        manage = [sys.executable, str(settings.BASE_DIR / "manage.py")]
        stop = {"now": False}
        signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
        signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
        try:
            supervisor.start(
                "simulator",
                [sys.executable, "-m", "simulator", "--port", str(sim_port), *DEMO_SIMULATOR_OPTIONS],
            )
            supervisor.start(
                "web",
                [
                    sys.executable,
                    "-m",
                    "daphne",
                    "-b",
                    "127.0.0.1",
                    "-p",
                    str(port),
                    "dispatch_project.asgi:application",
                ],
            )
            # /v1 on its own process (uvicorn); the web server keeps serving /v1 too, for old URLs.
            supervisor.start("ingress", [*manage, "runingress", "--port", str(ingress_port)])
            supervisor.start("dispatcher", [*manage, "rundispatcher", "--group", "demo", "--no-publish"])
            up = [wait_for_port(port, 60), wait_for_port(ingress_port, 30), wait_for_port(sim_port, 30)]
            if not all(up):
                raise CommandError(
                    f"the web server, ingress or simulator did not start; see {data_dir / 'logs'}"
                )
            self.stdout.write(
                self.style.SUCCESS(
                    f"\nLLM Dispatch demo is up.\n  Dashboard: http://127.0.0.1:{port}/  (login admin / "
                    f"{options['admin_password']})\n  Admin:     http://127.0.0.1:{port}/admin/\n"
                    f"  History:   http://127.0.0.1:{port}/history/\n  Metrics:   http://127.0.0.1:{port}/metrics\n"
                    f"  OpenAI API: http://127.0.0.1:{ingress_port}/v1  (a producer key: manage.py "
                    f"create_producer_key)\n"
                    f"  Logs:      {data_dir / 'logs'}\nPress Ctrl-C to stop everything.\n"
                )
            )
            if not options["no_load"]:
                supervisor.start(
                    "loadgen", [*manage, "loadgen", "--scale", str(options["load_scale"])], to_console=True
                )
            self._wait(supervisor, stop, options["duration"], None if had_valkey else data_dir)
        finally:
            self.stdout.write("stopping the demo ...")
            supervisor.stop_all()
            if not had_valkey:
                embedded.stop(data_dir)
            self.stdout.write("demo stopped.")

    def _wait(
        self, supervisor: Supervisor, stop: dict[str, bool], duration: float, valkey_dir: Path | None
    ) -> None:
        """Until Ctrl-C or ``duration``; restarts the embedded Valkey (under ``valkey_dir``) if it dies."""
        started = time.monotonic()
        while not stop["now"]:
            if duration and time.monotonic() - started > duration:
                return
            if valkey_dir is not None:
                self._revive_valkey(valkey_dir)
            crashed = supervisor.failed()
            if crashed is not None:
                raise CommandError(
                    f"{crashed.name} exited with {crashed.process.returncode}; "
                    f"see {crashed.log_path or 'the output above'}"
                )
            time.sleep(0.5)

    def _revive_valkey(self, data_dir: Path) -> None:
        """A crashed embedded Valkey comes back from its append-only file at the same address, where every
        process of the demo reconnects by itself."""
        if embedded.running(data_dir) is not None:
            return
        server = embedded.ensure(data_dir, appendfsync=settings.DISPATCH_VALKEY_APPENDFSYNC)
        self.stdout.write(f"the embedded Valkey had stopped; restarted it at {server.url} from its files")
