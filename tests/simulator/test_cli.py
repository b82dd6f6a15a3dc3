"""The simulator's options, defined once: ``python -m simulator`` and ``manage.py simbackend`` share them."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from ops.management.commands.simbackend import Command as SimBackend
from simulator.__main__ import main
from simulator.cli import CONFIG_OPTIONS, add_simulator_arguments, config_from_options
from simulator.config import SimulatorConfig

ARGS = [
    "--kind=sglang",
    "--latency-ms=5",
    "--latency-jitter=0.3",
    "--ttft-ms=20",
    "--itl-ms=4",
    "--max-running=8",
    "--kv-cache-tokens=4096",
    "--error-rate=0.1",
    "--error-statuses=500,502",
    "--rate-limit-rate=0.2",
    "--retry-after=3",
    "--hang-rate=0.01",
    "--seed=9",
]
EXPECTED = SimulatorConfig(
    kind="sglang",
    latency_ms=5,
    latency_sigma=0.3,
    ttft_ms=20,
    itl_ms=4,
    max_running=8,
    kv_cache_tokens=4096,
    error_rate=0.1,
    error_statuses=(500, 502),
    rate_limit_rate=0.2,
    retry_after_s=3,
    hang_rate=0.01,
    seed=9,
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_simulator_arguments(p)
    return p


def test_every_option_has_help_showing_its_default() -> None:
    options = [a for a in parser()._actions if a.option_strings and a.dest != "help"]
    assert len(options) >= 18
    for action in options:
        assert action.help and "(default: %(default)s)" in action.help, action.option_strings


def test_every_setting_but_the_body_limit_has_an_option() -> None:
    fields = {f.name for f in dataclasses.fields(SimulatorConfig)}
    assert {option.field for option in CONFIG_OPTIONS} == fields - {"max_body_bytes"}


def test_both_entry_points_build_the_same_config() -> None:
    assert config_from_options(vars(parser().parse_args(ARGS))) == EXPECTED
    command = SimBackend()
    options = vars(command.create_parser("manage.py", "simbackend").parse_args(ARGS))
    assert command.build_config(options) == EXPECTED
    assert config_from_options(vars(parser().parse_args([]))) == SimulatorConfig()


def test_latency_sigma_stays_an_alias_of_latency_jitter() -> None:
    assert parser().parse_args(["--latency-sigma", "0.7"]).latency_sigma == 0.7


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--error-rate", "5"], "error_rate must be between 0 and 1"),
        (["--itl-ms", "5", "--tokens-per-second", "10"], "set itl_ms or tokens_per_second, not both"),
        (["--port", "70000"], "must be a port between 0 and 65535"),
        (["--kind", "triton"], "invalid choice"),
        (["--error-statuses", "5xx"], "comma-separated status codes"),
    ],
)
def test_bad_options_are_refused_clearly(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err
    with pytest.raises(CommandError, match=message):
        call_command("simbackend", *argv)
