"""VALKEY_URL's forms, read without I/O: tables for the documented cases, hypothesis for the rest."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.valkey.url import InvalidValkeyUrl, SentinelUrl, parse_sentinel, redact, redis_py_url

THREE = (("h1", 26379), ("h2", 26380), ("h3", 26379))


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://127.0.0.1:6379/0", None),
        ("valkeys://:pw@host:6380/2", None),
        ("unix:///tmp/v.sock?db=1", None),
        (
            "redis+sentinel://h1:26379,h2:26380,h3/mymaster/0",
            SentinelUrl(sentinels=THREE, master_name="mymaster"),
        ),
        ("valkey+sentinel://h1/mymaster", SentinelUrl(sentinels=(("h1", 26379),), master_name="mymaster")),
        (
            "valkeys+sentinel://app:s%40cret@h1:1,[::1]:2/m/3?sentinel_password=sp",
            SentinelUrl(
                sentinels=(("h1", 1), ("::1", 2)), master_name="m", db=3, username="app",
                password="s@cret", sentinel_password="sp", tls=True,
            ),
        ),
        (
            "rediss+sentinel://:pw@h1/m?sentinel_username=u&sentinel_password=",
            SentinelUrl(
                sentinels=(("h1", 26379),), master_name="m", password="pw", sentinel_username="u",
                sentinel_password="", tls=True,
            ),
        ),
        ("redis+sentinel://pw@h1/m/0", SentinelUrl(sentinels=(("h1", 26379),), master_name="m",
                                                   password="pw")),
    ],
)  # fmt: skip
def test_parses_the_documented_forms(url: str, expected: SentinelUrl | None) -> None:
    assert parse_sentinel(url) == expected


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://h/m", "must start with one of"),
        ("h1:26379", "must start with one of"),
        ("redis+sentinel://h1:26379", "names the master"),
        ("redis+sentinel://h1/m/0/x", "names the master"),
        ("redis+sentinel://h1/m/zero", "is a number"),
        ("redis+sentinel://h1:port/m", "is not a number"),
        ("redis+sentinel://h1:0/m", "out of range"),
        ("redis+sentinel://h1,,h2/m", "has no host"),
        ("redis+sentinel://h1/m?master_password=x", "unknown VALKEY_URL option"),
    ],
)
def test_refuses_other_forms_clearly(url: str, message: str) -> None:
    with pytest.raises(InvalidValkeyUrl, match=message):
        parse_sentinel(url)


def test_a_refusal_never_repeats_a_password() -> None:
    with pytest.raises(InvalidValkeyUrl) as caught:
        parse_sentinel("redis+sentinel://user:hunter2@h1/m/x?sentinel_password=hunter3")
    assert "hunter2" not in str(caught.value) and "hunter3" not in str(caught.value)


def test_connection_keywords() -> None:
    url = parse_sentinel("valkeys+sentinel://app:pw@h1/m/4?sentinel_password=sp")
    assert url is not None
    assert url.connection_kwargs() == {"db": 4, "username": "app", "password": "pw", "ssl": True}
    assert url.sentinel_kwargs() == {"username": None, "password": "sp", "ssl": True}
    plain = parse_sentinel("redis+sentinel://h1/m")
    assert plain is not None and plain.connection_kwargs() == {"db": 0} and plain.sentinel_kwargs() == {}


def test_valkey_schemes_read_as_redis_py_schemes() -> None:
    assert redis_py_url("valkey://h:1/0") == "redis://h:1/0"
    assert redis_py_url("valkeys://h:1/0") == "rediss://h:1/0"
    assert redis_py_url("redis://h:1/0") == "redis://h:1/0"


hosts = st.lists(
    st.tuples(st.from_regex(r"[a-z][a-z0-9.-]{0,20}", fullmatch=True), st.integers(1, 65535)),
    min_size=1,
    max_size=5,
)
names = st.from_regex(r"[A-Za-z0-9_-]{1,20}", fullmatch=True)
secrets = st.text(st.characters(codec="ascii", exclude_characters="\x00"), min_size=1, max_size=20)


@given(hosts, names, st.integers(0, 15), secrets, st.booleans())
def test_round_trip_and_redaction(
    sentinels: list[tuple[str, int]], name: str, db: int, password: str, tls: bool
) -> None:
    from urllib.parse import quote

    scheme = "valkeys+sentinel" if tls else "valkey+sentinel"
    netloc = ",".join(f"{host}:{port}" for host, port in sentinels)
    secret = quote(password, safe="")
    url = f"{scheme}://app:{secret}@{netloc}/{name}/{db}?sentinel_password={secret}"
    parsed = parse_sentinel(url)
    assert parsed == SentinelUrl(
        sentinels=tuple(sentinels), master_name=name, db=db, username="app", password=password,
        sentinel_password=password, tls=tls,
    )  # fmt: skip
    assert redact(url) == f"{scheme}://{netloc}/{name}/{db}?sentinel_password=***"
