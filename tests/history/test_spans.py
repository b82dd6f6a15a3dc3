"""The ingester's decode of a stream entry (``entry_row``, rewriting the fresh JSON in place) gives the
row ``span_row`` gives for the same span, and ``span_row`` leaves the caller's span as it was."""

from __future__ import annotations

import copy
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from history.spans import entry_row, span_row
from tests.support.history_spans import execution_doc

SECRET_URL = "https://alice:s3cr3t-pw@llm.example:8443/v1?api_key=k-123"

_scalars = st.one_of(
    st.text(max_size=20),
    st.sampled_from([SECRET_URL, f"502 from {SECRET_URL}", "http://127.0.0.1:9/v1"]),
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
)
_values = st.one_of(_scalars, st.lists(_scalars, max_size=3))
_maps = st.dictionaries(st.text(max_size=10), _values, max_size=6)


# No deadline: a per-example time limit measures the machine's load, not the decode.
@settings(deadline=None)
@given(
    attributes=_maps,
    resource=_maps,
    event_attrs=st.lists(_maps, max_size=2),
    link_attrs=st.lists(_maps, max_size=2),
)
def test_entry_row_is_span_row_of_the_same_span(
    attributes: dict[str, Any],
    resource: dict[str, Any],
    event_attrs: list[dict[str, Any]],
    link_attrs: list[dict[str, Any]],
) -> None:
    doc = execution_doc()
    doc["attributes"].update(attributes)
    doc["resource"].update(resource)
    doc["events"] = [{"ts_ns": i, "name": f"e{i}", "attributes": a} for i, a in enumerate(event_attrs)]
    doc["links"] = [{"trace_id": "t", "span_id": f"s{i}", "attributes": a} for i, a in enumerate(link_attrs)]
    before = copy.deepcopy(doc)
    row = span_row(doc)
    assert doc == before
    assert entry_row(orjson.dumps(doc)) == row
    assert all("s3cr3t-pw" not in str(cell) and "k-123" not in str(cell) for cell in row)
