"""The messages an admin write shows about publishing its groups' configuration to Valkey."""

from __future__ import annotations

from django.contrib import messages
from django.db import transaction
from django.http import HttpRequest

from pools import services

REPUBLISH_HINT = (
    "Running dispatchers keep their previous configuration; "
    "run `manage.py pools_publish` once Valkey is back."
)


def report_publication(request: HttpRequest, results: list[services.PublishResult]) -> None:
    """One message per published group, once the admin's transaction has committed and published.

    ``results`` is the list a service fills at commit; this hook is registered after the service's,
    and commit hooks run in registration order, so it reads the list filled.
    """
    transaction.on_commit(lambda: _report_results(request, results))


def _report_results(request: HttpRequest, results: list[services.PublishResult]) -> None:
    """Info when the configuration reached Valkey, a warning when it did not."""
    for result in results:
        if result.ok and result.unpublished:
            messages.info(request, f"Group “{result.group_id}” removed from its dispatchers' configuration.")
        elif result.ok:
            messages.info(
                request,
                f"Configuration of group “{result.group_id}” published to its dispatchers "
                f"(version {result.version}).",
            )
        else:
            messages.warning(
                request,
                f"Saved, but the configuration of group “{result.group_id}” was not published: "
                f"{result.error}. "
                f"{REPUBLISH_HINT}",
            )
