"""Audio sources beside the frame source (audio-visual workloads).

An ``AudioSource`` is four methods: ``open()`` (fails fast with ``SourceError``),
``read(n_samples)`` -> mono float32 samples in [-1, 1] at the configured sample rate,
``close()`` and ``describe()``. The runner reads, for each captured frame, the samples that
arrived since the previous one and attaches them as ``Frame.audio``.

Kinds: ``tone`` (a phase-continuous sine), ``noise`` (seeded white noise) and ``wav`` (a WAV
file read once with ``scipy.io.wavfile``: PCM 8/16/24/32-bit or float, mixed to mono and
resampled to ``sample_rate``; at its end it loops, or yields silence when ``loop = false``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from soakd.config import AudioSettings
from soakd.errors import SourceError


@runtime_checkable
class AudioSource(Protocol):
    sample_rate: int

    def open(self) -> None: ...
    def read(self, n_samples: int) -> np.ndarray: ...
    def close(self) -> None: ...
    def describe(self) -> dict[str, Any]: ...


class ToneSource:
    """A sine at ``freq_hz``; consecutive reads continue the same wave."""

    def __init__(self, sample_rate: int, freq_hz: float, amplitude: float) -> None:
        self.sample_rate = sample_rate
        self.freq_hz = freq_hz
        self.amplitude = amplitude
        self._pos = 0
        self._step = 2.0 * math.pi * freq_hz / sample_rate

    def open(self) -> None:
        self._pos = 0

    def read(self, n_samples: int) -> np.ndarray:
        idx = np.arange(self._pos, self._pos + max(0, n_samples), dtype=np.float64)
        self._pos += max(0, n_samples)
        return (self.amplitude * np.sin(idx * self._step)).astype(np.float32)

    def close(self) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "tone",
            "sample_rate": self.sample_rate,
            "freq_hz": self.freq_hz,
            "amplitude": self.amplitude,
        }


class NoiseSource:
    """White noise of standard deviation ``amplitude / 3``, clipped to ``±amplitude``."""

    def __init__(self, sample_rate: int, amplitude: float, seed: int = 0) -> None:
        self.sample_rate = sample_rate
        self.amplitude = amplitude
        self.seed = seed
        self._rng = np.random.default_rng(seed)

    def open(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    def read(self, n_samples: int) -> np.ndarray:
        x = self._rng.standard_normal(max(0, n_samples), dtype=np.float32)
        x *= self.amplitude / 3.0
        return np.clip(x, -self.amplitude, self.amplitude, out=x)

    def close(self) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "noise",
            "sample_rate": self.sample_rate,
            "amplitude": self.amplitude,
            "seed": self.seed,
        }


class WavSource:
    """A WAV file, decoded once at ``open`` into mono float32 at ``sample_rate``."""

    def __init__(self, path: str | Path, sample_rate: int, loop: bool = True) -> None:
        self.path = Path(path).expanduser()
        self.sample_rate = sample_rate
        self.loop = loop
        self._data: np.ndarray | None = None
        self._pos = 0
        self._native: dict[str, Any] = {}

    def open(self) -> None:
        if self._data is not None:
            return
        data, native_rate = _read_wav(self.path)
        self._native = {"native_rate": native_rate, "native_samples": int(data.shape[0])}
        self._data = _resample(data, native_rate, self.sample_rate)
        self._pos = 0

    def read(self, n_samples: int) -> np.ndarray:
        data = self._data
        if data is None:
            raise SourceError(f"audio {str(self.path)!r}: read before open")
        out = np.zeros(max(0, n_samples), dtype=np.float32)
        filled = 0
        while filled < out.size:
            if self._pos >= data.size:
                if not self.loop:
                    break  # the rest stays silent
                self._pos = 0
            take = min(out.size - filled, data.size - self._pos)
            out[filled : filled + take] = data[self._pos : self._pos + take]
            filled += take
            self._pos += take
        return out

    def close(self) -> None:
        self._data = None

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "wav",
            "path": str(self.path),
            "sample_rate": self.sample_rate,
            "loop": self.loop,
            **self._native,
        }


def _read_wav(path: Path) -> tuple[np.ndarray, int]:
    """Mono float32 samples in [-1, 1] and the file's rate, or SourceError."""
    from scipy.io import wavfile

    if not path.is_file():
        raise SourceError(f"audio {str(path)!r}: no such file")
    try:
        rate, raw = wavfile.read(path)
    except (ValueError, OSError, EOFError) as exc:
        raise SourceError(f"audio {str(path)!r}: not a readable WAV file: {exc}") from exc
    if raw.size == 0:
        raise SourceError(f"audio {str(path)!r}: no samples")
    x = _to_float(np.asarray(raw))
    if x.ndim == 2:
        x = x.mean(axis=1, dtype=np.float32)
    return np.ascontiguousarray(x, dtype=np.float32), int(rate)


def _to_float(raw: np.ndarray) -> np.ndarray:
    if raw.dtype == np.uint8:  # 8-bit WAV is unsigned
        return (raw.astype(np.float32) - 128.0) / 128.0
    if np.issubdtype(raw.dtype, np.integer):
        return raw.astype(np.float32) / float(-np.iinfo(raw.dtype).min)
    return np.clip(raw.astype(np.float32), -1.0, 1.0)


def _resample(x: np.ndarray, rate: int, target: int) -> np.ndarray:
    if rate == target:
        return x
    from scipy.signal import resample_poly

    g = math.gcd(rate, target)
    return resample_poly(x, target // g, rate // g).astype(np.float32)


def make_audio_source(settings: AudioSettings, seed: int = 0) -> AudioSource | None:
    """The configured audio source (not yet opened), or None for ``kind = "none"``."""
    if settings.kind == "none":
        return None
    if settings.kind == "tone":
        return ToneSource(settings.sample_rate, settings.freq_hz, settings.amplitude)
    if settings.kind == "noise":
        return NoiseSource(settings.sample_rate, settings.amplitude, seed)
    assert settings.path is not None  # enforced by AudioSettings
    return WavSource(settings.path, settings.sample_rate, settings.loop)
