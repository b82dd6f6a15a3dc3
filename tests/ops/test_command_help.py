"""Every option of our management commands explains itself in --help, defaults included."""

from __future__ import annotations

import argparse

import pytest
from django.core.management import get_commands, load_command_class
from django.core.management.base import BaseCommand

OUR_APPS = ("ops", "pools", "history", "dashboard")


def our_commands() -> list[tuple[str, str]]:
    return sorted((name, app) for name, app in get_commands().items() if app in OUR_APPS)


def django_option_dests() -> set[str]:
    """Options every command inherits from Django (--verbosity, --settings, ...): Django documents them."""
    return {a.dest for a in BaseCommand().create_parser("manage.py", "base")._actions}


def test_the_walk_finds_the_commands() -> None:
    names = {name for name, _ in our_commands()}
    assert {"rundispatcher", "demo", "seed_demo", "pools_publish", "runhistory", "history_migrate"} <= names


@pytest.mark.parametrize(("name", "app"), our_commands())
def test_every_option_has_help_and_shows_its_default(name: str, app: str) -> None:
    command = load_command_class(app, name)
    assert command.help.strip(), f"{name} has no help"
    parser = command.create_parser("manage.py", name)
    inherited = django_option_dests()
    problems = []
    for action in parser._actions:
        if action.dest in inherited:
            continue
        label = "/".join(action.option_strings) or action.dest
        if not (action.help or "").strip():
            problems.append(f"{label}: no help")
            continue
        # Identity, not equality: a default of 0 is a default to show, False (a flag's) is not.
        unset = any(action.default is v for v in (None, False, argparse.SUPPRESS)) or action.default == []
        if not unset and "%(default)s" not in action.help:
            problems.append(f"{label}: default {action.default!r} not shown")
    assert not problems, f"manage.py {name}: " + "; ".join(problems)
    parser.format_help()  # every %-placeholder renders
