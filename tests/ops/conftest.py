"""Operator tests read history too: the embedded ClickHouse fixtures of the history tests."""

import pytest

from tests.history.conftest import ch_url, history  # noqa: F401


@pytest.fixture
def group_g(db):
    """Fabric group "g": one enabled pool, a backend nobody listens on (for commands that refuse to run)."""
    from pools.models import Backend, FabricGroup, Pool

    backend = Backend.objects.create(backend_id="nowhere", base_url="http://127.0.0.1:9/v1", kind="openai",
                                     load_gating=False)  # fmt: skip
    group = FabricGroup.objects.create(group_id="g", name="G", total_concurrency=4, backend=backend)
    Pool.objects.create(group=group, pool_id="p-g")
    return group
