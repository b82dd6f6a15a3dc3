"""The Django side's one Valkey helper: one cached client, one tuple of Valkey errors, owned by an app."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pools import connections

ROOT = Path(__file__).resolve().parents[2]
APPS = ("pools", "history", "dashboard", "ops")


def test_one_cached_client_whose_connection_survives_close() -> None:
    client = connections.sync_client()
    assert connections.sync_client() is client
    first = client.client_id()
    client.close()  # what callers do after a read: it must not tear the shared pool down
    assert connections.sync_client().client_id() == first  # same TCP connection, not a reconnect


def test_another_url_gets_its_own_client(settings, valkey_url: str) -> None:
    client = connections.sync_client()
    connections.valkey_url.cache_clear()
    settings.VALKEY_URL = valkey_url.rsplit("/", 1)[0] + "/1"
    try:
        other = connections.sync_client()
        assert other is not client
        assert other.connection_pool.connection_kwargs["db"] == 1
    finally:
        connections.valkey_url.cache_clear()


def test_an_unreachable_valkey_raises_one_of_the_valkey_errors(valkey_down: str) -> None:
    with pytest.raises(connections.VALKEY_ERRORS):
        connections.sync_client().ping()


def test_dashboard_catches_the_same_errors() -> None:
    from dashboard import selectors

    assert selectors.VALKEY_ERRORS is connections.VALKEY_ERRORS


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_apps_do_not_import_the_project_package() -> None:
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for app in APPS
        for path in sorted((ROOT / app).rglob("*.py"))
        for name in _imported_modules(path)
        if name == "dispatch_project" or name.startswith("dispatch_project.")
    ]
    assert offenders == []
