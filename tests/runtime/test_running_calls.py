"""RunningCalls: the per-pool count it keeps is always the count of the calls it holds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.dispatch.running import Running, RunningCalls
from runtime.wire.contract import ChatCall, Envelope

POOLS = ("interactive", "batch", "bulk")
MEMBERS = tuple(f"m{i}" for i in range(6))
CALL = ChatCall.from_openai({"model": "m", "messages": [{"role": "user", "content": "hi"}]})


def _run(member: str, pool_id: str) -> Running:
    return Running(Envelope(f"req-{member}", "prod", pool_id, CALL, enqueued_at=0.0), pool_id, member, 1, 0.0)


def _recount(calls: RunningCalls) -> dict[str, int]:
    counts: dict[str, int] = {}
    for run in calls.values():
        counts[run.pool_id] = counts.get(run.pool_id, 0) + 1
    return counts


_op = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(MEMBERS), st.sampled_from(POOLS)),
    st.tuples(st.just("del"), st.sampled_from(MEMBERS), st.none()),
    st.tuples(st.just("pop"), st.sampled_from(MEMBERS), st.none()),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_op, max_size=60))
def test_each_pools_count_matches_the_calls_held_after_any_sequence(ops: list[tuple[str, str, str | None]]):
    calls = RunningCalls()
    for verb, member, pool_id in ops:
        if verb == "set":
            assert pool_id is not None
            calls[member] = _run(member, pool_id)  # a member run again replaces its earlier call
        elif member in calls:
            if verb == "del":
                del calls[member]
            else:
                assert calls.pop(member).member == member
        else:
            with pytest.raises(KeyError):
                if verb == "del":
                    del calls[member]
                else:
                    calls.pop(member)
        assert calls.by_pool() == _recount(calls)
        assert all(calls.in_pool(p) == _recount(calls).get(p, 0) for p in POOLS)


def test_a_mutation_that_would_bypass_the_count_is_refused() -> None:
    calls = RunningCalls()
    calls["m0"] = _run("m0", "batch")
    for mutate in (
        calls.clear,
        lambda: calls.update({"m1": _run("m1", "batch")}),
        lambda: calls.setdefault("m1", _run("m1", "batch")),
        calls.popitem,
    ):
        with pytest.raises(TypeError):
            mutate()
    assert calls.by_pool() == {"batch": 1}
    assert list(calls) == ["m0"]


def test_by_pool_is_a_copy_the_caller_cannot_corrupt() -> None:
    calls = RunningCalls()
    calls["m0"] = _run("m0", "batch")
    calls.by_pool()["batch"] = 99
    assert calls.in_pool("batch") == 1
