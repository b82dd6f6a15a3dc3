"""A backend's error through the ingress, as the real openai SDK with its default settings sees it.

The SDK retries 408, 409, 429 and 5xx twice by default: a backend's 400 must reach it as a 400, or the
backend runs the bad request three times. Backend calls are counted on the simulator's own counter.
No message or header the client reads names the backend's address.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import openai
import orjson
import pytest

from tests.support.ingress_stack import GROUP, Stack
from tests.support.waiting import wait_until_sync

pytestmark = pytest.mark.slow
HELLO = [{"role": "user", "content": "Hello"}]
# The module's tests send nine retryable failures (429 and 5xx, each tried three times by the SDK)
# within the breaker's 30 s window. With the default five the breaker opened and held each later call
# for its 10 s (breaker_open_s): what these tests check is how an error reads, not the breaker, which
# tests/runtime/test_backend_gating.py covers.
BREAKER_FAILURES = 1000
RAISE_BREAKER = """
from pools import services
from pools.models import Backend
backend = Backend.objects.get(backend_id="ing-sim")
backend.breaker_failures = {failures}
[result] = services.backend_save(backend=backend)
assert not result.error, result.error
print(result.version)
"""


def sdk(stack: Stack, key: str) -> openai.OpenAI:
    """The SDK exactly as a client would make it: default retries, default timeouts."""
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=key)


@pytest.fixture(scope="module", autouse=True)
def breaker_out_of_the_way(stack: Stack) -> None:
    """The backend's breaker opens only after :data:`BREAKER_FAILURES`, once the dispatcher runs the
    configuration that says so (its snapshot's ``config_version``). The module's stack ends with it."""
    version = int(stack.manage("shell", "-c", RAISE_BREAKER.format(failures=BREAKER_FAILURES)).split()[-1])

    def applied() -> bool:
        with stack.valkey() as client:
            raw = [client.get(key) for key in client.scan_iter(stack.keys.snapshot_pattern(GROUP))]
        return any(r and orjson.loads(r)["config_version"] >= version for r in raw)

    wait_until_sync(applied, what=f"the dispatcher running configuration version {version}")


def assert_no_address(stack: Stack, error: openai.APIStatusError) -> None:
    host = urlsplit(stack.sim_url).netloc
    shown = [str(error), error.response.text, *(f"{k}: {v}" for k, v in error.response.headers.items())]
    for text in shown:
        assert host not in text and "127.0.0.1" not in text, text


def backend_calls_since(stack: Stack, before: int) -> int:
    return stack.sim_count() - before


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_backends_400_reaches_the_client_once(stack: Stack, alice_key: str, stream: bool) -> None:
    # The backend quotes its own address, as some gateways do: the client still never reads it.
    said = f"model 'nope' does not exist at {stack.sim_url}/v1"
    before = stack.sim_count()
    with pytest.raises(openai.BadRequestError) as caught:
        sdk(stack, alice_key).chat.completions.create(
            model="nope", messages=HELLO, stream=stream,  # type: ignore[arg-type]
            extra_body={"sim": {"status": 400, "message": said}},
        )  # fmt: skip
    assert backend_calls_since(stack, before) == 1
    error = caught.value
    assert error.status_code == 400
    assert error.code == "backend_http_error"
    assert "model 'nope' does not exist at ***" in error.message
    assert_no_address(stack, error)


def test_a_backends_429_keeps_its_retry_after(stack: Stack, alice_key: str) -> None:
    before = stack.sim_count()
    with pytest.raises(openai.RateLimitError) as caught:
        sdk(stack, alice_key).chat.completions.create(
            model="m", messages=HELLO,  # type: ignore[arg-type]
            extra_body={"sim": {"status": 429, "message": "slow down", "retry_after": 1}},
        )  # fmt: skip
    error = caught.value
    assert error.status_code == 429 and error.message.endswith("slow down")
    assert error.response.headers["retry-after"] == "1"
    # The SDK honours a 429 (after its Retry-After) twice, as it would against OpenAI itself.
    assert backend_calls_since(stack, before) == 3
    assert_no_address(stack, error)


@pytest.mark.parametrize(("backend_status", "status"), [(500, 502), (503, 503)])
def test_a_backends_5xx_is_a_502_or_503(
    stack: Stack, alice_key: str, backend_status: int, status: int
) -> None:
    with pytest.raises(openai.InternalServerError) as caught:
        sdk(stack, alice_key).chat.completions.create(
            model="m", messages=HELLO,  # type: ignore[arg-type]
            extra_body={"sim": {"status": backend_status, "message": f"boom at {stack.sim_url}"}},
        )  # fmt: skip
    assert caught.value.status_code == status
    assert_no_address(stack, caught.value)
