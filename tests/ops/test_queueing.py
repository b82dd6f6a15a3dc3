"""What rundispatcher says about its group's queueing switch, decided from the old and new config."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from ops.queueing import queueing_notice
from runtime.wire.groupconfig import GroupConfig

ON = GroupConfig(group_id="g", queueing_enabled=True)
OFF = replace(ON, queueing_enabled=False)


@pytest.mark.parametrize(
    ("previous", "current", "level", "words"),
    [
        (None, ON, logging.INFO, "fabric group g has queueing enabled"),
        (None, OFF, logging.WARNING, "fabric group g has queueing disabled: producers call its endpoint"),
        (ON, OFF, logging.WARNING, "queueing disabled for fabric group g: producers call its endpoint"),
        (OFF, ON, logging.INFO, "queueing re-enabled for fabric group g"),
    ],
)
def test_start_and_every_switch_is_announced(
    previous: GroupConfig | None, current: GroupConfig, level: int, words: str
) -> None:
    notice = queueing_notice(previous, current)
    assert notice is not None
    assert notice[0] == level and notice[1].startswith(words)


@pytest.mark.parametrize("config", [ON, OFF])
def test_other_changes_say_nothing(config: GroupConfig) -> None:
    assert queueing_notice(config, replace(config, total_concurrency=3, version=9)) is None


def test_the_disabled_line_says_what_the_dispatcher_still_does() -> None:
    notice = queueing_notice(None, OFF)
    assert notice is not None and "only drains requests queued before the switch" in notice[1]
