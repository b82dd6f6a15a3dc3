"""``bench._path_stamps.offsets``: per-call medians from the stamps file the c1 path probe reads."""

from __future__ import annotations

from bench._path_stamps import offsets


def _call(t0: float, events: list[tuple[str, float]]) -> list[str]:
    return [f"start {t0:.6f}"] + [f"{event} {t0 + ms / 1000:.6f}" for event, ms in events]


def test_calls_whose_token_overtakes_finish_are_one_path_with_the_others() -> None:
    in_order = [("finish_sent", 1.0), ("finish_done", 2.0), ("token", 3.0)]
    overtaken = [("finish_sent", 1.0), ("token", 1.5), ("finish_done", 2.5)]
    lines = _call(10, in_order) + _call(11, overtaken) + _call(12, in_order) + _call(13, [])
    at, typical, total = offsets(lines)
    assert (typical, total) == (3, 3)  # the last call is dropped: its next wake-up never came
    assert at["start"] == 0
    assert abs(at["finish_sent"] - 1.0) < 0.01
    assert abs(at["finish_done"] - 2.0) < 0.01 and abs(at["token"] - 3.0) < 0.01


def test_finish_answer_and_span_after_the_next_start_belong_to_the_call_that_sent_finish() -> None:
    # With claim tickets the reply FINISH carries lets the caller's next request reach the inbox, and
    # that call start, before FINISH's answer is read.
    path = [("execute", 0.1), ("finish_sent", 1.0)]
    late = [("finish_done", 0.4), ("span", 0.5)]  # the call before's, read after this call started
    own = [("execute", 0.6), ("finish_sent", 1.5), ("finish_done", 2.5), ("span", 2.6), ("token", 3.5)]
    lines = [
        "finish_done 9.999000",  # a warm-up call's, before any stamped call: nobody's
        *_call(10, [*path, ("finish_done", 2.0), ("span", 2.1), ("token", 3.0)]),
        *_call(11, [*path, ("token", 1.5)]),
        *_call(11.0016, [*late, *own]),
        *_call(12, []),
    ]
    at, typical, total = offsets(lines)
    assert (typical, total) == (3, 3)
    assert abs(at["finish_done"] - 2.0) < 0.01 and abs(at["span"] - 2.1) < 0.01
    assert abs(at["finish_sent"] - 1.0) < 0.01 and abs(at["token"] - 3.0) < 0.01


def test_a_call_missing_an_event_is_left_out_and_a_repeated_event_keeps_its_first_time() -> None:
    full = [("round", 1.0), ("claim_sent", 2.0)]
    twice = [("round", 1.0), ("claim_sent", 2.0), ("claim_sent", 9.0)]
    lines = _call(10, full) + _call(11, [("round", 5.0)]) + _call(12, twice) + _call(13, full) + _call(14, [])
    at, typical, total = offsets(lines)
    assert (typical, total) == (3, 4)
    assert abs(at["round"] - 1.0) < 0.01 and abs(at["claim_sent"] - 2.0) < 0.01


def test_no_finished_call_gives_no_offsets() -> None:
    assert offsets(_call(10, [("round", 1.0)])) == ({}, 0, 0)
    assert offsets([]) == ({}, 0, 0)
