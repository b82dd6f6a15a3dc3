"""Table tests for backend URL redaction."""

from __future__ import annotations

import pytest

from runtime.backends.redact import (
    UNPARSEABLE,
    is_secret_param,
    redact_url,
    scrub_address,
    strip_userinfo,
    url_has_credentials,
    userinfo_secret,
)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
        ("https://api.example.com/v1/", "https://api.example.com/v1/"),
        ("https://user:s3cret@api.example.com/v1", "https://api.example.com/v1"),
        ("https://user:s3cret@api.example.com:8443/v1", "https://api.example.com:8443/v1"),
        ("https://sk-only@api.example.com/v1", "https://api.example.com/v1"),
        ("https://:sk-abc@api.example.com/v1", "https://api.example.com/v1"),
        ("https://us%40er:p%3Ass@host/v1", "https://host/v1"),
        ("https://a:b@[::1]:8000/v1", "https://[::1]:8000/v1"),
        ("https://host/v1?api_key=abc", "https://host/v1?api_key=***"),
        ("https://host/v1?API_KEY=abc", "https://host/v1?API_KEY=***"),
        ("https://host/v1?key=abc&api-version=2024-02-01", "https://host/v1?key=***&api-version=2024-02-01"),
        ("https://host/v1?token=t&x=1&secret=s", "https://host/v1?token=***&x=1&secret=***"),
        ("https://host/v1?Password=p", "https://host/v1?Password=***"),
        ("https://host/v1?sig=abc&se=2030", "https://host/v1?sig=***&se=2030"),
        ("https://host/f?X-Amz-Signature=deadbeef", "https://host/f?X-Amz-Signature=***"),
        ("https://host/v1?access_token=abc", "https://host/v1?access_token=***"),
        ("https://host/v1?apikey=abc", "https://host/v1?apikey=***"),
        ("https://host/v1?keyword=llama&monkey=1", "https://host/v1?keyword=llama&monkey=1"),
        ("https://host/v1?key=", "https://host/v1?key="),
        ("https://host/v1?key", "https://host/v1?key"),
        ("https://host/v1#access_token=abc", "https://host/v1#access_token=***"),
        ("https://u:p@host/v1?key=k&model=m", "https://host/v1?key=***&model=m"),
        ("http://[::1", UNPARSEABLE),
    ],
)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:8000/v1", False),
        ("https://api.example.com/v1?api-version=2024-02-01", False),
        ("https://host/v1?keyword=x", False),
        ("https://host/v1?key=", False),
        ("https://user:pw@host/v1", True),
        ("https://user@host/v1", True),
        ("https://host/v1?api_key=abc", True),
        ("https://host/v1?Token=abc", True),
        ("https://host/v1?signature=abc", True),
        ("https://host/v1#token=abc", True),
        ("http://[::1", True),
    ],
)
def test_url_has_credentials(url: str, expected: bool) -> None:
    assert url_has_credentials(url) is expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("api_key", True),
        ("api-key", True),
        ("x-api-key", True),
        ("KEY", True),
        ("client_secret", True),
        ("sig", True),
        ("Signature", True),
        ("auth", True),
        ("model", False),
        ("api-version", False),
        ("signed", False),
        ("keys_count", False),
    ],
)
def test_is_secret_param(name: str, expected: bool) -> None:
    assert is_secret_param(name) is expected


@pytest.mark.parametrize(
    ("url", "stripped", "secret"),
    [
        ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1", None),
        ("https://user:pw@host/v1?api-version=1", "https://host/v1?api-version=1", "pw"),
        ("https://sk-abc@host/v1", "https://host/v1", "sk-abc"),
        ("https://:sk%2Fabc@host/v1", "https://host/v1", "sk/abc"),
        # strip_userinfo keeps secret query parameters: the request still needs them.
        ("https://host/v1?key=k", "https://host/v1?key=k", None),
    ],
)
def test_strip_userinfo_and_secret(url: str, stripped: str, secret: str | None) -> None:
    assert strip_userinfo(url) == stripped
    assert userinfo_secret(url) == secret


@pytest.mark.parametrize(
    ("said", "url", "secrets", "shown"),
    [
        ("no model x at http://10.0.0.5:8100/v1", "http://10.0.0.5:8100/v1", (), "no model x at ***"),
        ("upstream 10.0.0.5:8100 refused", "http://10.0.0.5:8100/v1", (), "upstream *** refused"),
        ("host gpu-7.internal is busy", "http://gpu-7.internal/v1", (), "host *** is busy"),
        ("bad key sk-123 for https://h/v1", "https://u:sk-123@h/v1", ("sk-123",), "bad key *** for ***"),
        ("context too long", "http://10.0.0.5:8100/v1", ("sk",), "context too long"),
    ],
)
def test_scrub_address(said: str, url: str, secrets: tuple[str, ...], shown: str) -> None:
    assert scrub_address(said, url, secrets) == shown
