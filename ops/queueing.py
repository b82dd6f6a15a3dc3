"""What a dispatcher tells the operator about its group's queueing switch.

With queueing disabled in the admin, producers call the group's endpoint directly (no queue, no
fairness, no dispatcher in the path). A dispatcher of such a group keeps running: it drains the
requests queued before the switch (or by producers that have not yet read the new configuration), and
schedules again as soon as queueing is switched back on.
"""

from __future__ import annotations

import logging

from runtime.dispatch.dispatcher import Dispatcher
from runtime.wire.groupconfig import GroupConfig

log = logging.getLogger("ops.rundispatcher")

_DIRECT = (
    "producers call its endpoint directly; this dispatcher only drains requests queued before the switch"
)
QUEUEING_OFF = "fabric group {group} has queueing disabled: " + _DIRECT
QUEUEING_ON = "fabric group {group} has queueing enabled: this dispatcher schedules its pools"
QUEUEING_SWITCHED_OFF = "queueing disabled for fabric group {group}: " + _DIRECT
QUEUEING_SWITCHED_ON = (
    "queueing re-enabled for fabric group {group}: producers queue again and this dispatcher schedules them"
)


def queueing_notice(previous: GroupConfig | None, current: GroupConfig) -> tuple[int, str] | None:
    """The log level and line for a configuration change; None when the queueing mode did not change."""
    group = current.group_id
    if previous is None:
        if current.queueing_enabled:
            return logging.INFO, QUEUEING_ON.format(group=group)
        return logging.WARNING, QUEUEING_OFF.format(group=group)
    if previous.queueing_enabled == current.queueing_enabled:
        return None
    if current.queueing_enabled:
        return logging.INFO, QUEUEING_SWITCHED_ON.format(group=group)
    return logging.WARNING, QUEUEING_SWITCHED_OFF.format(group=group)


class OperatorDispatcher(Dispatcher):
    """The runtime's dispatcher, plus the lines ``rundispatcher`` owes the operator on every new config."""

    def apply_config(self, config: GroupConfig) -> None:
        previous = self.config
        super().apply_config(config)
        notice = queueing_notice(previous, config)
        if notice is not None:
            log.log(*notice)
