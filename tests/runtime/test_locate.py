"""runtime.valkey.locate: a plain script finds the installation's Valkey as the commands do."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.valkey import embedded
from runtime.valkey.locate import installation_url
from runtime.valkey.url import InvalidValkeyUrl


def test_valkey_url_wins() -> None:
    assert installation_url({"VALKEY_URL": " redis://example:6379/2 "}) == "redis://example:6379/2"


def test_the_sentinel_form_is_accepted_and_a_mistyped_url_refused_by_name() -> None:
    url = "valkey+sentinel://:pw@s1:26379,s2/mymaster/0"
    assert installation_url({"VALKEY_URL": url}) == url
    with pytest.raises(InvalidValkeyUrl, match="names the master") as caught:
        installation_url({"VALKEY_URL": "redis+sentinel://:pw@s1:26379,s2:26379"})
    assert "pw" not in str(caught.value)


def test_the_embedded_server_recorded_under_the_data_dir(private_valkey: embedded.EmbeddedValkey) -> None:
    assert installation_url({"DISPATCH_DATA_DIR": str(private_valkey.data_dir)}) == private_valkey.url


def test_nothing_running_says_where_it_looked_and_starts_nothing(tmp_path: Path) -> None:
    with pytest.raises(embedded.EmbeddedValkeyError, match=str(tmp_path)):
        installation_url({"DISPATCH_DATA_DIR": str(tmp_path)})
    assert not (tmp_path / embedded.STATE_FILE).exists()
