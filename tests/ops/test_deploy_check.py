"""``manage.py check --deploy`` under the production profile of docs/deploy.md, as a real process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.production_profile import production_env

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # a manage.py process each


def deploy_check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_production_profile_passes_the_deploy_check(tmp_path: Path) -> None:
    done = deploy_check(production_env(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "no issues" in done.stdout


def test_a_development_default_left_in_production_fails_the_check(tmp_path: Path) -> None:
    """The development secret key passes Django's own W009 (long, varied): only its origin tells."""
    env = production_env(tmp_path)
    del env["DJANGO_SECRET_KEY"], env["DJANGO_ALLOWED_HOSTS"]
    done = deploy_check(env)
    assert done.returncode == 1
    expected = "(dispatch.W002) DEBUG is off, but DJANGO_SECRET_KEY, DJANGO_ALLOWED_HOSTS are not set"
    assert expected in done.stderr
    assert "security.W009" not in done.stderr


def test_without_the_proxy_settings_django_names_each_missing_one(tmp_path: Path) -> None:
    env = production_env(tmp_path, DJANGO_SECURE_COOKIES="false", DJANGO_SECURE_HSTS_SECONDS="0")
    done = deploy_check(env)
    assert done.returncode == 1
    for check in ("security.W004", "security.W012", "security.W016"):
        assert check in done.stderr
