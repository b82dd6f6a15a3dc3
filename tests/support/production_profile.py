"""The production profile of docs/deploy.md as a process environment, for tests that start processes."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

HOST = "dispatch.example.com"


def production_env(data_dir: Path, **overrides: str) -> dict[str, str]:
    """This process's environment with the documented production settings (DEBUG off) on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "dispatch_project.settings",
            "DJANGO_DEBUG": "false",
            "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
            "DJANGO_ALLOWED_HOSTS": HOST,
            "DJANGO_CSRF_TRUSTED_ORIGINS": f"https://{HOST}",
            "DISPATCH_DATA_DIR": str(data_dir),
            **overrides,
        }
    )
    return env
