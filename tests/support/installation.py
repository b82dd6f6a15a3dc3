"""Operator commands as real processes on a throwaway installation (its own data dir and SQLite)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from tests.support.waiting import wait_until_sync

ROOT = Path(__file__).resolve().parents[2]
MANAGE = [sys.executable, str(ROOT / "manage.py")]
# Settings a developer's shell or the suite may carry that would point a child at someone else's data.
_FOREIGN = ("VALKEY_URL", "DATABASE_URL", "CLICKHOUSE_URL", "DISPATCH_KEY_PREFIX", "DISPATCH_GATEWAY_ID")


def installation_env(data_dir: Path, **settings: str) -> dict[str, str]:
    """The environment of a fresh installation under ``data_dir``; ``settings`` are added on top."""
    data_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in _FOREIGN}
    env.update(
        DISPATCH_DATA_DIR=str(data_dir),
        DJANGO_SETTINGS_MODULE="dispatch_project.settings",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=str(ROOT),  # this checkout, ahead of whichever one the venv installed
    )
    env.update(settings)
    return env


def manage(env: Mapping[str, str], *args: str, timeout: float = 120) -> str:
    """Runs one command to completion; its output, or an AssertionError carrying it."""
    done = subprocess.run(
        [*MANAGE, *args], cwd=ROOT, env=dict(env), capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"manage.py {' '.join(args)} exited {done.returncode}:\n{done.stderr}"
    return done.stdout


def sql(data_dir: Path, statement: str) -> list[tuple]:
    """One statement on the installation's SQLite database, committed."""
    with sqlite3.connect(data_dir / "db.sqlite3", timeout=10) as db:
        return db.execute(statement).fetchall()


class Running:
    """A child process whose output lines (stdout and stderr) are collected as they arrive."""

    def __init__(self, args: list[str], env: Mapping[str, str]) -> None:
        self.args = args
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            args,
            cwd=ROOT,
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def saw(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def output(self, last: int = 80) -> str:
        return "\n".join(self.lines[-last:])

    def wait_for(self, text: str, timeout: float) -> None:
        wait_until_sync(lambda: self.saw(text) or self.proc.poll() is not None, timeout, what=repr(text))
        assert self.saw(text), f"{self.args[2:]} exited before printing {text!r}:\n{self.output()}"

    def stop(self, sig: int = signal.SIGINT, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise
        self._reader.join(5)
        return code
