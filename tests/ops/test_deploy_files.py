"""The deployment files start real commands: every systemd unit's ExecStart and every Procfile line.

Each ``manage.py`` command line must name a command of this project (or Django) and pass options its
parser accepts; ``--help`` of each command runs as a process and lists every option used. daphne's
lines are parsed by daphne's own argument parser, and the Valkey units' configuration files are
started by a real Valkey server. Only ClickHouse's own binary is not on this machine: its unit is
checked for shape alone.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from django.core.management import CommandError, get_commands, load_command_class

from runtime.valkey.embedded import free_port, valkey_binary
from tests.support.waiting import port_open, wait_until_sync

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "docs" / "deploy" / "systemd"
DOC = ROOT / "docs" / "deploy.md"
# What systemd and the Procfile runner substitute; values an operator would use.
SUBSTITUTIONS = {"%t": "/run", "$PORT": "8000", "$DISPATCH_GROUP": "demo"}
INSTANCES = {  # a template unit's example instance
    "llm-dispatch-web@.service": "8001",
    "llm-dispatch-ingress@.service": "8101",
    "llm-dispatch-dispatcher@.service": "demo",
    "llm-dispatch-valkey@.service": "primary",
}
PROCESS_KINDS = {"web", "ingress", "dispatcher", "history", "release"}


def unit_commands(path: Path) -> list[list[str]]:
    text = path.read_text()
    assert "[Service]" in text and "[Install]" in text, f"{path.name} is not a whole unit"
    # A oneshot unit has several ExecStart lines, each a command of its own.
    lines = [line.removeprefix("ExecStart=") for line in text.splitlines() if line.startswith("ExecStart=")]
    assert lines, f"{path.name} starts nothing"
    return [substitute(line, INSTANCES.get(path.name, "")) for line in lines]


def procfile_commands() -> dict[str, list[list[str]]]:
    commands: dict[str, list[list[str]]] = {}
    for line in (ROOT / "Procfile").read_text().splitlines():
        kind, _, command = line.partition(":")
        commands[kind] = [substitute(part, "") for part in command.split("&&")]
    return commands


def substitute(command: str, instance: str) -> list[str]:
    for name, value in {**SUBSTITUTIONS, "%i": instance}.items():
        command = command.replace(name, value)
    return shlex.split(command)


def all_commands() -> list[tuple[str, list[str]]]:
    found = [(unit.name, argv) for unit in sorted(UNITS.glob("*.service")) for argv in unit_commands(unit)]
    found += [(f"Procfile {kind}", argv) for kind, argvs in procfile_commands().items() for argv in argvs]
    return found


def manage_command(argv: list[str]) -> tuple[str, list[str]] | None:
    """(command, options) of a ``python manage.py ...`` line, else None."""
    if Path(argv[0]).name.startswith("python") and argv[1:2] == ["manage.py"]:
        return argv[2], argv[3:]
    return None


def test_every_process_kind_has_a_unit_a_procfile_line_and_a_place_in_the_doc() -> None:
    units = {unit.name for unit in UNITS.glob("*.service")}
    assert {
        "llm-dispatch-web@.service", "llm-dispatch-ingress@.service",
        "llm-dispatch-dispatcher@.service", "llm-dispatch-history.service",
        "llm-dispatch-release.service", "llm-dispatch-valkey@.service",
        "llm-dispatch-valkey-sentinel.service", "clickhouse-server.service",
    } <= units  # fmt: skip
    assert set(procfile_commands()) == PROCESS_KINDS
    doc = DOC.read_text()
    # A template unit is named with an instance in the doc: llm-dispatch-web@PORT.service.
    missing = [name for name in [*units, "Procfile"] if name.replace("@.service", "@") not in doc]
    assert not missing, f"docs/deploy.md does not mention {missing}"


@pytest.mark.parametrize(("where", "argv"), all_commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_each_command_line_is_accepted_by_its_program(where: str, argv: list[str]) -> None:
    program = Path(argv[0]).name
    if (found := manage_command(argv)) is not None:
        name, options = found
        commands = get_commands()
        assert name in commands, f"{where}: manage.py has no command {name!r}"
        parser = load_command_class(commands[name], name).create_parser("manage.py", name)
        try:
            parser.parse_args(options)
        except CommandError as exc:
            pytest.fail(f"{where}: manage.py {name} refuses {options}: {exc}")
    elif program == "daphne":
        from daphne.cli import CommandLineInterface

        args = CommandLineInterface().parser.parse_args(argv[1:])  # exits (fails the test) on a bad option
        assert args.application == "dispatch_project.asgi:application"
        assert (ROOT / "dispatch_project" / "asgi.py").exists()
    elif program in ("valkey-server", "valkey-sentinel"):
        assert argv[1].startswith("/etc/llm-dispatch/valkey/"), where
        assert (ROOT / "docs" / "deploy" / "valkey" / Path(argv[1]).name).exists(), argv[1]
    else:
        assert program == "clickhouse-server", f"{where}: unexpected program {argv[0]}"


def manage_help(name: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", name, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow  # one manage.py process per command
def test_each_manage_command_lists_the_options_the_files_use_in_its_help() -> None:
    used: dict[str, set[str]] = {}
    for _, argv in all_commands():
        if (found := manage_command(argv)) is not None:
            used.setdefault(found[0], set()).update(o.split("=")[0] for o in found[1] if o.startswith("--"))
    expected = {
        "migrate", "collectstatic", "history_migrate", "pools_publish", "runingress", "rundispatcher",
        "runhistory",
    }  # fmt: skip
    assert expected <= set(used)
    for name, options in sorted(used.items()):
        text = manage_help(name)
        missing = [option for option in options if option not in text]
        assert not missing, f"manage.py {name} --help does not list {missing}"


def config_value(config: Path, name: str) -> str | None:
    lines = config.read_text().splitlines()
    return next((line.split()[1] for line in lines if line.startswith(f"{name} ")), None)


@pytest.mark.parametrize("config", ["primary.conf", "replica.conf", "sentinel.conf"])
def test_the_shipped_valkey_configurations_start_a_real_server(config: str, tmp_path: Path) -> None:
    """Each file as its unit passes it (``--supervised systemd``), on a free local port."""
    path = tmp_path / config
    # The data directory (the unit's StateDirectory) is read as the file loads: this test's own instead.
    lines = (ROOT / "docs" / "deploy" / "valkey" / config).read_text().splitlines()
    path.write_text("\n".join(f"dir {tmp_path}" if line.startswith("dir ") else line for line in lines))
    port = free_port()
    args = [str(path), *(["--sentinel"] if config == "sentinel.conf" else []), "--supervised", "systemd"]
    args += ["--port", str(port), "--bind", "127.0.0.1"]
    log = (tmp_path / "valkey.log").open("wb")
    proc = subprocess.Popen([valkey_binary(), *args], cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until_sync(lambda: port_open(port) or proc.poll() is not None, 10, what="valkey listening")
        assert proc.poll() is None, (tmp_path / "valkey.log").read_text()
        with redis.Redis(port=port, password=config_value(path, "requirepass")) as client:
            if config == "sentinel.conf":
                assert list(client.sentinel_masters()) == ["llm-dispatch"]
            else:
                info = client.info()
                assert info["aof_enabled"] == 1 and client.config_get("maxmemory-policy") == {
                    "maxmemory-policy": "noeviction"
                }
                assert info["role"] == ("slave" if config == "replica.conf" else "master")
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
