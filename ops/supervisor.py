"""Starts and stops the demo's child processes: each in its own session with its log in a file,
stopped in reverse order with SIGTERM, then SIGKILL after a grace period."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path | None


@dataclass
class Supervisor:
    log_dir: Path
    env: dict[str, str]
    children: list[Child] = field(default_factory=list)
    _logs: list[IO[bytes]] = field(default_factory=list)

    def start(self, name: str, argv: list[str], *, to_console: bool = False) -> Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = None if to_console else self.log_dir / f"{name}.log"
        out: IO[bytes] | None = None
        if log_path is not None:
            out = open(log_path, "ab")  # noqa: SIM115 - closed in stop_all
            self._logs.append(out)
        process = subprocess.Popen(
            argv,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            start_new_session=True,
        )
        child = Child(name, process, log_path)
        self.children.append(child)
        return child

    def failed(self) -> Child | None:
        """The first child that exited on its own, if any."""
        return next((c for c in self.children if c.process.poll() is not None), None)

    def stop_all(self, grace_s: float = 15.0) -> None:
        for child in reversed(self.children):
            if child.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.process.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while child.process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if child.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.process.pid, signal.SIGKILL)
                child.process.wait(5)
        for log in self._logs:
            log.close()
