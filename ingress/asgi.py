"""ASGI entry point of the ingress process kind (``manage.py runingress``): ``/v1`` alone, on uvicorn.

Nothing of Django's HTTP stack, Channels or the history ingester loads here: the process is one
producer (``ingress-{host}-{pid}``) and its spans go to Valkey like the web process's do.
"""

from __future__ import annotations

import gc
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatch_project.settings")
django.setup()

from ingress.build import build_ingress  # noqa: E402
from ingress.http import Receive, Scope, Send  # noqa: E402
from ops.runtime_settings import start_tracing  # noqa: E402

# Same service name as daphne's ingress: history shows one ingress whichever server carries it.
start_tracing("llm-dispatch-ingress")
ingress = build_ingress()


async def application(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
    else:
        await ingress(scope, receive, send)


async def lifespan(receive: Receive, send: Send) -> None:
    """Closing the producer at shutdown withdraws its liveness key at once, instead of letting it lapse."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            # What Django, the runtime and their imports made (~120,000 objects) lives as long as the
            # process; frozen, a full collection no longer walks it: a pause of whatever requests are
            # in flight, 220-370 ms at load 10-18 on the 2-core bench machine, <1 ms once frozen
            # (bench/RESULTS.md, issue 23 session 7).
            gc.collect()
            gc.freeze()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await ingress.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return
