"""The queue room's script registry: every .lua file becomes runnable source that Valkey compiles."""

from __future__ import annotations

from importlib import resources

import pytest

from runtime.queue import registry, scripts
from runtime.queue.keys import WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS

SCRIPTS = sorted(
    entry.name.removesuffix(".lua")
    for entry in resources.files("runtime.queue").joinpath("lua").iterdir()
    if entry.name.endswith(".lua") and not entry.name.startswith("_")
)


def test_every_script_file_is_named_in_the_scripts_module() -> None:
    named = {value for name, value in vars(scripts).items() if name.isupper() and isinstance(value, str)}
    assert [name for name in SCRIPTS if registry.source(name) not in named] == []


@pytest.mark.parametrize("name", SCRIPTS)
async def test_each_script_compiles_on_valkey_with_its_header_declared(aredis, name: str) -> None:
    text = registry.source(name)
    assert "-- KEYS:" in text and "$" not in text and "--!" not in text
    assert await aredis.script_load(text) == registry.script(name).sha


def test_fragments_are_included_with_their_parameters() -> None:
    push = registry.source("push")
    assert "redis.call('LLEN', KEYS[2]) < tonumber(ARGV[2])" in push
    assert "redis.call('PEXPIRE', KEYS[2], ARGV[3])" in push


def test_a_script_is_one_object_per_process() -> None:
    assert registry.script("claim") is registry.script("claim")


async def test_the_included_wake_pushes_one_token_at_most(aredis, keys) -> None:
    wake = registry.script("wake").bind(aredis)
    key = keys.wake_list("p")
    for _ in range(3):
        await wake(keys=[key], args=[WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS])
    assert await aredis.llen(key) == WAKE_TOKEN_CAP
    await aredis.delete(key)
