"""The admin's dead-letter page: list a pool's dead letters, replay or discard one, each in the log."""

from __future__ import annotations

import pytest
import redis
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.urls import reverse

from pools import selectors
from pools.models import FabricGroup, Pool
from runtime.queue.keys import KeySpace
from runtime.wire.contract import Envelope
from tests.support.pools_admin import dead_letter


def bury(client: redis.Redis, keys: KeySpace, request_id: str, *, pool_id: str = "backfill") -> None:
    client.rpush(keys.dead_letters(pool_id), dead_letter(request_id, pool_id=pool_id))


def page(group: FabricGroup) -> str:
    return reverse("admin:pools_pool_dead_letters", args=[Pool.objects.get(pool_id="backfill").pk])


def post(client: Client, url: str, action: str, digest: str) -> str:
    response = client.post(url, {"action": action, "letter": digest}, follow=True)
    assert response.status_code == 200
    return " ".join(str(m) for m in response.context["messages"])


def test_page_lists_dead_letters_with_reason_and_last_error(
    group: FabricGroup, superuser_client: Client, sredis: redis.Redis, keys: KeySpace
) -> None:
    bury(sredis, keys, "r-1")
    sredis.rpush(keys.dead_letters("backfill"), b"not json")
    html = superuser_client.get(page(group)).content.decode()
    assert "r-1" in html and "attempts_exhausted" in html and "HTTP 503: overloaded" in html
    assert "unreadable item (8 bytes)" in html
    changelist = superuser_client.get(reverse("admin:pools_pool_changelist")).content.decode()
    assert 'class="dead-letters-link">2 dead</a>' in changelist


def test_replay_queues_a_fresh_attempt_and_is_logged(
    group: FabricGroup, superuser_client: Client, sredis: redis.Redis, keys: KeySpace
) -> None:
    bury(sredis, keys, "r-1")
    bury(sredis, keys, "r-2")
    pool = Pool.objects.get(pool_id="backfill")
    first = selectors.pool_dead_letters(pool=pool)[0]
    shown = post(superuser_client, page(group), "replay", first.digest)
    assert "Replayed dead letter request r-1 of pool backfill" in shown
    [queued] = sredis.lrange(keys.requests("backfill"), 0, -1)
    envelope = Envelope.decode(queued)
    assert (envelope.request_id, envelope.attempt, envelope.deadline) == ("r-1", 1, None)
    assert [s.letter.request_id for s in selectors.pool_dead_letters(pool=pool) if s.letter] == ["r-2"]
    entry = LogEntry.objects.get(object_id=str(pool.pk))
    assert entry.get_change_message() == "Replayed dead letter request r-1"
    # The same letter again (a second operator, a double click): nothing happens, and nothing is logged.
    shown = post(superuser_client, page(group), "replay", first.digest)
    assert "Nothing to replay" in shown
    assert sredis.llen(keys.requests("backfill")) == 1 and LogEntry.objects.count() == 1


def test_a_letter_moved_between_lanes_is_replayed_from_the_list_it_sits_in(
    group: FabricGroup, superuser_client: Client, sredis: redis.Redis, keys: KeySpace
) -> None:
    # Its envelope names "interactive", but it died in (and sits in) backfill's dead-letter list.
    sredis.rpush(keys.dead_letters("backfill"), dead_letter("moved", pool_id="interactive"))
    [stored] = selectors.pool_dead_letters(pool=Pool.objects.get(pool_id="backfill"))
    shown = post(superuser_client, page(group), "replay", stored.digest)
    assert "Replayed dead letter request moved of pool backfill" in shown
    [queued] = sredis.lrange(keys.requests("backfill"), 0, -1)
    assert Envelope.decode(queued).request_id == "moved"
    assert sredis.llen(keys.requests("interactive")) == 0 and sredis.llen(keys.dead_letters("backfill")) == 0


def test_discard_removes_readable_and_unreadable_letters(
    group: FabricGroup, superuser_client: Client, sredis: redis.Redis, keys: KeySpace
) -> None:
    bury(sredis, keys, "r-1")
    sredis.rpush(keys.dead_letters("backfill"), b"not json")
    pool = Pool.objects.get(pool_id="backfill")
    readable, unreadable = selectors.pool_dead_letters(pool=pool)
    assert "Discarded dead letter request r-1" in post(
        superuser_client, page(group), "discard", readable.digest
    )
    assert "Discarded dead letter an unreadable item" in post(
        superuser_client, page(group), "discard", unreadable.digest
    )
    assert sredis.llen(keys.dead_letters("backfill")) == 0 and sredis.llen(keys.requests("backfill")) == 0
    assert LogEntry.objects.filter(object_id=str(pool.pk)).count() == 2
    assert "No dead letters." in superuser_client.get(page(group)).content.decode()


def test_page_says_when_valkey_is_down(
    group: FabricGroup, superuser_client: Client, valkey_down: str
) -> None:
    html = superuser_client.get(page(group)).content.decode()
    assert "Valkey cannot be reached" in html


@pytest.fixture
def viewer(db) -> Client:
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    user = get_user_model().objects.create_user("viewer", "v@example.com", "pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_pool"))
    client = Client()
    client.force_login(user)
    return client


def test_a_viewer_cannot_replay(
    group: FabricGroup, viewer: Client, sredis: redis.Redis, keys: KeySpace
) -> None:
    bury(sredis, keys, "r-1")
    [stored] = selectors.pool_dead_letters(pool=Pool.objects.get(pool_id="backfill"))
    assert viewer.get(page(group)).status_code == 200
    assert viewer.post(page(group), {"action": "replay", "letter": stored.digest}).status_code == 403
    assert sredis.llen(keys.dead_letters("backfill")) == 1
