"""The queue protocol in one room: every Valkey key name and every Lua script of LLM Dispatch.

* :mod:`runtime.queue.keys` names every key, channel and stream, with their TTLs;
* ``runtime/queue/lua/*.lua`` holds every script, each file's header declaring its KEYS and ARGV;
  :mod:`runtime.queue.registry` loads them (the only place that turns a file into runnable source);
* :mod:`runtime.queue.scripts` names the scripts and their result codes;
* the operations, by client side: the producer's (:mod:`~runtime.queue.producing`,
  :mod:`~runtime.queue.admission`), the dispatcher's (:mod:`~runtime.queue.dispatching`,
  :mod:`~runtime.queue.turn`, :mod:`~runtime.queue.leases`) and the operator's
  (:mod:`~runtime.queue.groups`; dead letters in :mod:`runtime.dispatch.deadletters`).

The producer and the dispatcher are both clients of this room; neither imports the other.
"""
