"""The pool admin's dead-letter page: a pool's dead letters, each replayed or discarded by a POST."""

from __future__ import annotations

import datetime

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse

from pools import selectors, services
from pools.connections import VALKEY_ERRORS
from pools.models import Pool


def _when(timestamp: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(timestamp, tz=datetime.UTC)


class DeadLettersAdminMixin:
    """The pool admin's ``pools_pool_dead_letters`` view (its URL is in ``PoolAdmin.get_urls``)."""

    def dead_letters_view(self, request: HttpRequest, object_id: int) -> HttpResponse:
        """Lists a pool's dead letters; a POST replays or discards one and records it in the log."""
        pool = get_object_or_404(Pool, pk=object_id)
        if not self.has_view_permission(request, pool):
            raise PermissionDenied
        if request.method == "POST":
            if not self.has_change_permission(request, pool):
                raise PermissionDenied
            self._act_on_dead_letter(request, pool)
            return redirect(request.path)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Dead letters of {pool.pool_id}",
            "pool": pool,
            "opts": self.opts,
        }
        try:
            context["letters"] = [
                {
                    "letter": stored.letter,
                    "digest": stored.digest,
                    "raw_size": len(stored.raw),
                    "dead_at": _when(stored.letter.dead_at) if stored.letter else None,
                }
                for stored in selectors.pool_dead_letters(pool=pool)
            ]
        except VALKEY_ERRORS as exc:
            context["unavailable"] = str(exc) or exc.__class__.__name__
        return TemplateResponse(request, "admin/pools/pool/dead_letters.html", context)

    def _act_on_dead_letter(self, request: HttpRequest, pool: Pool) -> None:
        action, digest = request.POST.get("action"), request.POST.get("letter", "")
        if action == "replay":
            result = services.dead_letter_replay(pool=pool, digest=digest)
        elif action == "discard":
            result = services.dead_letter_discard(pool=pool, digest=digest)
        else:
            messages.error(request, f"Unknown dead-letter action {action!r}.")
            return
        what = f"request {result.request_id}" if result.request_id else "an unreadable item"
        if not result.done:
            messages.warning(request, f"Nothing to {action}: {result.error}.")
            return
        done = "Replayed" if action == "replay" else "Discarded"
        self.log_change(request, pool, f"{done} dead letter {what}")
        messages.success(request, f"{done} dead letter {what} of pool {pool.pool_id}.")
