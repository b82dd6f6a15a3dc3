"""Operator tests read history too: the embedded ClickHouse fixtures of the history tests."""

from tests.history.conftest import ch_url, history  # noqa: F401
