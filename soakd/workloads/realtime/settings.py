"""``[workload]`` of ``kind = "realtime"`` (the session: client.py, protocol.py)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, Field

from soakd.sections import Duration, EnvName, Questions, _Section


def _check_ws_url(v: str) -> str:
    """A ``ws://`` or ``wss://`` URL with a host; a password in it is refused (it would be
    stored with the run's settings): the key goes in ``api_key_env``."""
    from urllib.parse import urlsplit

    parts = urlsplit(v)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ValueError(
            f"must be a ws:// or wss:// URL such as 'ws://127.0.0.1:8000/v1/realtime', got {v!r}"
        )
    if parts.password is not None or parts.username is not None:
        raise ValueError("must not carry a user or password: put the key in workload.api_key_env")
    if parts.fragment:
        raise ValueError(f"must not carry a fragment, got {v!r}")
    return v


WsUrl = Annotated[str, AfterValidator(_check_ws_url)]


class RealtimeWorkloadSettings(_Section):
    """A realtime session server: OpenAI's Realtime event vocabulary (OpenAI, Azure, vLLM,
    vLLM-Omni, NVIDIA NIMs, Qwen-Omni-Realtime) or vLLM-Omni's streaming video input."""

    kind: Literal["realtime"] = "realtime"
    #: a model behind a network endpoint: its server's process and metrics are sampled and
    #: judged too (telemetry/server.py, analysis/server.py)
    served: ClassVar[bool] = True
    protocol: Literal["openai-realtime", "vllm-omni-video"] = "openai-realtime"
    url: WsUrl = "ws://127.0.0.1:8000/v1/realtime"
    model: str | None = None  # openai-realtime: sent as ?model= and in session.update
    api_key_env: EnvName | None = None  # the variable holding the key (never stored)
    instructions: str | None = None
    # passed through in session.update / session.config (modalities, turn detection, ...)
    session: dict[str, Any] = Field(default_factory=dict)
    jpeg_quality: int = Field(85, ge=1, le=100)
    short_side: int | None = Field(None, ge=14, le=8192)  # resize before encoding
    audio_chunk_ms: int = Field(40, ge=20, le=100)  # the [audio] source, sent in chunks this long
    output_audio_rate: int = Field(24000, ge=8000, le=192000)  # Hz of the PCM16 audio out
    question: str = Field("What is happening now?", min_length=1)
    question_every_s: Duration | None = Field(5.0, gt=0)  # None: only the timed questions
    questions: Questions = ()  # asked at_s seconds into the run
    response_timeout_s: Duration = Field(30.0, gt=0)  # a turn with no done event this long
    connect_timeout_s: Duration = Field(10.0, gt=0)  # setup: the handshake and first event
    # the server unreachable (every reconnect refused) for this long ends the run (INVALID)
    unreachable_timeout_s: Duration = Field(30.0, gt=0)
    reconnect_backoff_s: Duration = Field(0.5, gt=0)
