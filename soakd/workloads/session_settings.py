"""``[workload]`` of ``kind = "session"`` (the workload: session.py)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from soakd.sections import Device, Duration, GenerationSettings, Questions

#: the authors' runner's default prompt (MOSS-VL-Realtime, run_online_inference.py)
MOSS_RUNNER_PROMPT = (
    "As the video streams frame by frame, respond to this question whenever the visual "
    "evidence lets you answer or updates a previous answer; otherwise stay silent.\n\n"
    "Question: What happens in the video?"
)


class SessionWorkloadSettings(GenerationSettings):
    """A model with MOSS-VL-Realtime's ``create_realtime_session`` interface."""

    kind: Literal["session"] = "session"
    #: one stream only: the model keeps one stream's state between frames (run.streams = 1)
    single_stream: ClassVar[bool] = True
    model_path: str | None = None  # None: the built-in tiny session model (offline tests)
    device: Device = "cpu"
    # as the authors' runner (inference/realtime/run_online_inference.py) ships them: dtype
    # bfloat16, attention "auto" (flash_attention_2 on CUDA, else eager; None: transformers'
    # own choice), their prompt, a frame queue of 256 (the tiny model uses neither dtype nor
    # attention)
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "bfloat16"
    attn_implementation: str | None = "auto"
    trust_remote_code: bool = False
    initial_prompt: str = MOSS_RUNNER_PROMPT
    frame_queue_size: int = Field(256, ge=1)
    max_tokens_per_turn: int = Field(12, ge=1)
    max_new_tokens: int = Field(64, ge=1)
    poll_timeout_s: float = Field(0.05, gt=0, le=10)
    response_timeout_s: Duration = Field(30.0, gt=0)  # no output for this long = hung
    # built-in tiny model only: a frame whose 16x16 grey thumbnail differs from the previous
    # one by less than this (mean absolute difference, 0-255) is answered with <|silence|>
    silence_threshold: float = Field(1.0, ge=0)
    system_prompt: str | None = None  # None: the model's own default system prompt
    # passed through to create_realtime_session(**generate_kwargs) (temperature, top_p...)
    generate_kwargs: dict[str, bool | int | float | str] = Field(default_factory=dict)
    torch_threads: int | None = Field(None, ge=1, le=1024)  # None: torch's (tiny model: 1)
    max_pixels: int | None = Field(None, ge=1024)  # larger frames are downscaled before push
    questions: Questions = ()  # pushed with push_prompt during the run

    @field_validator("generate_kwargs")
    @classmethod
    def _own_keys(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key in v:
            if key in SESSION_OWN_KEYS:
                raise ValueError(f"{key!r} is a setting of its own: set workload.{key}")
        return v


#: session settings that generate_kwargs may not repeat (each is a [workload] key)
SESSION_OWN_KEYS: tuple[str, ...] = (
    "initial_prompt",
    "system_prompt",
    "frame_queue_size",
    "max_tokens_per_turn",
    "max_new_tokens",
    "do_sample",
)
