"""Header checks (pure): what may be written into a request head, as a table and as properties."""

from __future__ import annotations

import httptools
import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.backends.http.headers import check_header
from runtime.errors import InvalidHeader

TOKEN_CHARS = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
names = st.text(TOKEN_CHARS, min_size=1, max_size=20)
CONTROLS = "".join(map(chr, [*range(0x09), *range(0x0A, 0x20), 0x7F]))  # all but the tab
# Latin-1, as heads are encoded; control characters left out.
safe_values = st.text(st.characters(max_codepoint=255, exclude_characters=CONTROLS), max_size=40)


@pytest.mark.parametrize(
    ("name", "value", "refused"),
    [
        ("authorization", "Bearer sk-1", False),
        ("x-extra", "a b\tc", False),
        ("x-extra", "", False),
        ("authorization", "Bearer sk-1\r\nx-injected: yes", True),
        ("authorization", "Bearer sk-1\nx", True),
        ("authorization", "Bearer sk-1\rx", True),
        ("authorization", "Bearer sk-1\0", True),
        ("x-extra", "a\x1fb", True),
        ("x-extra", "a\x7fb", True),
        ("x extra", "v", True),
        ("x-extra:", "v", True),
        ("x-extra\r\nx-injected", "v", True),
        ("", "v", True),
        ("x-é", "v", True),
    ],
)
def test_names_are_tokens_and_values_have_no_line_breaks(name: str, value: str, refused: bool) -> None:
    if refused:
        with pytest.raises(InvalidHeader):
            check_header(name, value)
    else:
        check_header(name, value)


@given(name=names, value=safe_values)
def test_an_accepted_header_is_read_back_as_exactly_one_header(name: str, value: str) -> None:
    """What passes the check cannot start a line of its own: a parser reads back one header, the name."""
    check_header(name, value)
    seen: list[tuple[bytes, bytes]] = []

    class Collect:
        def on_header(self, n: bytes, v: bytes) -> None:
            seen.append((n, v))

    head = f"POST / HTTP/1.1\r\nhost: h\r\n{name}: {value}\r\ncontent-length: 0\r\n\r\n"
    httptools.HttpRequestParser(Collect()).feed_data(head.encode("latin-1"))
    assert [n.decode() for n, _ in seen] == ["host", name, "content-length"]


@given(name=names, before=safe_values, breaker=st.sampled_from(CONTROLS), after=safe_values)
def test_a_value_with_a_control_character_anywhere_is_refused(
    name: str, before: str, breaker: str, after: str
) -> None:
    with pytest.raises(InvalidHeader, match="has a control character") as info:
        check_header(name, before + breaker + after)
    assert repr(name) in str(info.value)
