"""``kind = "realtime"``: a model served as a streaming WebSocket session.

* ``settings.py``: the ``[workload]`` settings, ``RealtimeWorkloadSettings`` (pydantic and
  ``soakd.sections`` only: ``soakd.config`` composes it into ``[workload]``);
* ``protocol.py``: the wire dialects, ``openai-realtime`` and ``vllm-omni-video``: the client
  events soakd sends and what each server event means;
* ``client.py``: the session: one socket, a sender thread that takes the newest frame only
  (latest-frame rule), a receiver thread that times each turn, reconnects and expiry.

The driver is ``soakd/run/drivers/realtime.py``. Nothing here but ``settings.py`` is imported
by ``soakd.config``, so a run of another kind never imports ``websockets``.
"""

from __future__ import annotations

from typing import Any


def build(settings: Any, ctx: Any) -> Any:
    from soakd.workloads.realtime.client import RealtimeSession

    return RealtimeSession(settings, ctx)
