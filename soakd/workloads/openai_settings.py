"""``[workload]`` of ``kind = "openai"`` (the workload: openai.py)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from soakd.sections import MAX_STREAMS, BaseUrl, Duration, EnvName, _Section


class OpenAIWorkloadSettings(_Section):
    """A model served behind an OpenAI-compatible ``/v1/chat/completions`` endpoint (vLLM,
    SGLang, TGI, llama.cpp's server, ``transformers serve``, Ollama), driven over HTTP."""

    kind: Literal["openai"] = "openai"
    #: a model behind a network endpoint: its server's process and metrics are sampled and
    #: judged too (telemetry/server.py, analysis/server.py)
    served: ClassVar[bool] = True
    base_url: BaseUrl = "http://127.0.0.1:8000/v1"  # the API root: <base_url>/chat/completions
    model: str | None = None  # None: the first model <base_url>/models lists
    prompt: str = "Describe what is happening in this frame."
    system_prompt: str | None = None
    max_tokens: int = Field(16, ge=1, le=65536)
    temperature: float = Field(0.0, ge=0, le=2)
    stream: bool = True  # SSE: time to first token (infer) and the rest of the stream (decode)
    frames_per_request: int = Field(1, ge=1, le=64)  # the last N frames as N images (a clip)
    jpeg_quality: int = Field(85, ge=1, le=100)
    short_side: int | None = Field(
        None, ge=14, le=8192
    )  # resize before encoding; None: as captured
    # merged into the request body (e.g. mm_processor_kwargs, ignore_eos, top_k); may not
    # repeat a key soakd sets itself
    extra_body: dict[str, Any] = Field(default_factory=dict)
    api_key_env: EnvName | None = None  # the variable holding the API key (never stored)
    # requests in flight, one per stream: sets run.streams when it is left at 1
    concurrency: int | None = Field(None, ge=1, le=MAX_STREAMS)
    request_timeout_s: Duration = Field(60.0, gt=0, le=86_400)  # one request, connect to last byte
    ready_timeout_s: Duration = Field(60.0, gt=0, le=86_400)  # setup: wait this long for the server
    # the server unreachable (refused, reset, timed out) for this long ends the run (INVALID)
    unreachable_timeout_s: Duration = Field(30.0, gt=0, le=86_400)

    @field_validator("extra_body")
    @classmethod
    def _own_body_keys(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key in v:
            if key in OPENAI_OWN_KEYS:
                raise ValueError(f"{key!r} is set by soakd: use workload.{OPENAI_OWN_KEYS[key]}")
        return v


#: request body keys soakd sets itself -> the [workload] key that sets them
OPENAI_OWN_KEYS: dict[str, str] = {
    "model": "model",
    "messages": "prompt",
    "max_tokens": "max_tokens",
    "max_completion_tokens": "max_tokens",
    "temperature": "temperature",
    "stream": "stream",
    "stream_options": "stream",
}
