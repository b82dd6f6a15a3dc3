"""The embedded Valkey keeps what it holds across a clean stop and a kill -9, at the same address."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import redis

from runtime.valkey import embedded


def _client(server: embedded.EmbeddedValkey) -> redis.Redis:
    return redis.Redis.from_url(server.url, socket_timeout=5)


def test_a_clean_restart_keeps_the_data_and_the_address(tmp_path: Path) -> None:
    server = embedded.start(tmp_path)
    try:
        with _client(server) as client:
            client.rpush("list:llm:requests:p", *[f"r{i}" for i in range(10)])
        embedded.stop(tmp_path)
        again = embedded.ensure(tmp_path)
        assert again.url == server.url
        with _client(again) as client:
            assert client.llen("list:llm:requests:p") == 10
    finally:
        embedded.stop(tmp_path)


def test_a_killed_server_comes_back_with_its_fsynced_writes_at_the_same_address(tmp_path: Path) -> None:
    server = embedded.start(tmp_path, appendfsync="always")
    try:
        with _client(server) as client:
            client.rpush("list:llm:requests:p", *[f"r{i}" for i in range(10)])
            assert client.config_get("appendonly") == {"appendonly": "yes"}
        os.kill(server.pid, signal.SIGKILL)
        os.waitpid(server.pid, 0)  # the test started it: reap it so the pid is gone
        assert embedded.running(tmp_path) is None
        again = embedded.ensure(tmp_path)
        assert again.port == server.port
        with _client(again) as client:
            assert client.lrange("list:llm:requests:p", 0, -1) == [f"r{i}".encode() for i in range(10)]
    finally:
        embedded.stop(tmp_path)


def test_an_unknown_fsync_policy_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(embedded.EmbeddedValkeyError, match="everysec"):
        embedded.start(tmp_path, appendfsync="sometimes")
