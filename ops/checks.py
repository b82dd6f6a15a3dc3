"""Deploy checks (``manage.py check --deploy``) of what Django's own security checks cannot see.

dispatch.W002  DEBUG is off but a setting still has its development default (not set in the environment)
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks


@checks.register(checks.Tags.security, deploy=True)
def check_production_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    # Django's W009 passes the development key (long and varied enough); only its origin tells.
    if settings.DEBUG or not settings.DEVELOPMENT_DEFAULTS_IN_USE:
        return []
    names = settings.DEVELOPMENT_DEFAULTS_IN_USE
    return [
        checks.Warning(
            f"DEBUG is off, but {', '.join(names)} {'is' if len(names) == 1 else 'are'} not set in the "
            "environment: the development value is in force.",
            hint="Set them in the environment of every web process (docs/deploy.md, the production profile).",
            id="dispatch.W002",
        )
    ]
