"""profile_dispatcher's Valkey report: the per-call arithmetic (pure), and one short real run."""

from __future__ import annotations

import re

import pytest

from bench import profile_dispatcher


def test_valkey_report_gives_each_command_per_call_most_costly_first() -> None:
    before = {"evalsha": (100, 1000.0), "rpush": (50, 100.0), "get": (7, 3.0), "cpu": (0, 5_000.0)}
    after = {
        "evalsha": (400, 7000.0),  # 300 calls, 6000 us
        "rpush": (250, 500.0),  # 200 calls, 400 us
        "get": (7, 3.0),  # not run during the measured calls: left out
        "hset": (100, 900.0),  # first seen during them
        "cpu": (0, 35_000.0),
    }
    lines = profile_dispatcher.valkey_report(before, after, calls=100).splitlines()
    assert lines[0].startswith("Valkey CPU 0.300 ms/call")
    rows = [line.split() for line in lines[1:]]
    assert rows == [
        ["evalsha", "3.00", "60.00", "us"],
        ["hset", "1.00", "9.00", "us"],
        ["rpush", "2.00", "4.00", "us"],
    ]


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_short_run_reports_the_scripts_every_call_makes(capsys: pytest.CaptureFixture[str]) -> None:
    profile_dispatcher.main(["--level", "2", "--calls", "300", "--warmup", "50", "--valkey"])
    out = capsys.readouterr().out
    cpu = re.search(r"Valkey CPU ([0-9.]+) ms/call", out)
    assert cpu is not None and float(cpu.group(1)) > 0
    scripts = re.search(r"^\s+evalsha\s+([0-9.]+)\s+([0-9.]+) us$", out, re.MULTILINE)
    assert scripts is not None
    # The producer's push is a script and so is the dispatcher's FINISH: more than one per call.
    assert float(scripts.group(1)) > 1.0 and float(scripts.group(2)) > 0
    # Every completion's FINISH rides in some trip, and a trip carries at least one of them.
    finishing = re.search(r" ([0-9.]+) FINISH trips \(([0-9.]+) finishes each\)", out)
    assert finishing is not None
    assert 0 < float(finishing.group(1)) <= 1.0 and float(finishing.group(2)) >= 1.0
