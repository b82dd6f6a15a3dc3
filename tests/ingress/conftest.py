from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.ingress_stack import Stack, start_stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, valkey_url: str) -> Iterator[Stack]:
    running = start_stack(Path(tmp_path_factory.mktemp("ingress")), valkey_url, f"t{uuid.uuid4().hex[:10]}:")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def alice_key(stack: Stack) -> str:
    """Allowed into every pool of the test group; default pool gold."""
    return stack.create_key("alice", "gold,iron,solo,noend,dormant")
