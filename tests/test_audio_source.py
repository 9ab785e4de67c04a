"""Audio sources: tone, noise and real WAV files written by the tests."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest
from scipy.io import wavfile

from soakd.config import AudioSettings
from soakd.errors import ExitCode, SourceError
from soakd.sources.audio import (
    AudioSource,
    NoiseSource,
    ToneSource,
    WavSource,
    make_audio_source,
)


def _write_pcm16(path: Path, samples: np.ndarray, rate: int) -> None:
    """Write int16 PCM (frames x channels) with the stdlib wave module."""
    with wave.open(str(path), "wb") as w:
        w.setnchannels(samples.shape[1])
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.astype("<i2").tobytes())


def test_tone_is_phase_continuous_across_reads() -> None:
    """Reading a tone in chunks gives exactly the samples of one long read."""
    a, b = ToneSource(16000, 440.0, 0.3), ToneSource(16000, 440.0, 0.3)
    a.open()
    b.open()
    chunks = np.concatenate([a.read(n) for n in (100, 1, 533, 1366)])
    np.testing.assert_allclose(chunks, b.read(2000), atol=1e-6)
    assert chunks.dtype == np.float32


def test_tone_has_its_frequency_and_amplitude() -> None:
    """A 1 s tone at 440 Hz peaks at 440 Hz in its spectrum and never exceeds amplitude."""
    src = ToneSource(16000, 440.0, 0.5)
    src.open()
    x = src.read(16000)
    assert np.argmax(np.abs(np.fft.rfft(x))) == 440
    assert 0.49 < np.abs(x).max() <= 0.5


def test_noise_is_seeded_and_bounded() -> None:
    """Noise with the same seed repeats after open(); it stays within ±amplitude."""
    src = NoiseSource(16000, 0.3, seed=7)
    src.open()
    first = src.read(5000)
    src.open()
    np.testing.assert_array_equal(first, src.read(5000))
    assert np.abs(first).max() <= 0.3
    assert first.std() > 0.05
    other = NoiseSource(16000, 0.3, seed=8)
    other.open()
    assert not np.array_equal(first, other.read(5000))


def test_wav_pcm16_stereo_is_mixed_to_mono_and_resampled(tmp_path: Path) -> None:
    """A stereo 8 kHz PCM16 WAV reads as mono float32 at 16 kHz with the same tone."""
    t = np.arange(8000) / 8000
    left = 0.5 * np.sin(2 * np.pi * 200 * t)
    stereo = (np.stack([left, left], axis=1) * 32767).round()
    path = tmp_path / "tone.wav"
    _write_pcm16(path, stereo, 8000)
    src = WavSource(path, 16000, loop=False)
    src.open()
    x = src.read(16000)
    assert x.dtype == np.float32 and x.shape == (16000,)
    assert np.argmax(np.abs(np.fft.rfft(x))) == 200
    assert 0.45 < np.abs(x).max() < 0.55
    assert src.describe()["native_rate"] == 8000


def test_wav_loops_or_goes_silent_at_its_end(tmp_path: Path) -> None:
    """At the end of the file a looping source wraps around; a non-looping one pads zeros."""
    data = np.linspace(-0.5, 0.5, 100, dtype=np.float32)
    path = tmp_path / "ramp.wav"
    wavfile.write(path, 16000, data)  # 32-bit float WAV
    looping = WavSource(path, 16000, loop=True)
    looping.open()
    np.testing.assert_allclose(looping.read(250), np.concatenate([data, data, data[:50]]))
    once = WavSource(path, 16000, loop=False)
    once.open()
    out = once.read(150)
    np.testing.assert_allclose(out[:100], data)
    assert not out[100:].any()


def test_missing_wav_is_a_source_error_naming_the_path(tmp_path: Path) -> None:
    """A WAV path that does not exist fails at open with a one-line error and exit code 2."""
    path = tmp_path / "nope.wav"
    src = make_audio_source(AudioSettings(kind="wav", path=str(path)))
    assert src is not None
    with pytest.raises(SourceError, match=r"nope.wav.*no such file") as err:
        src.open()
    assert err.value.exit_code == ExitCode.USAGE
    assert "\n" not in str(err.value)


def test_unreadable_wav_is_a_source_error(tmp_path: Path) -> None:
    """A file that is not a WAV fails at open with an error naming the file."""
    path = tmp_path / "bad.wav"
    path.write_bytes(b"this is not a RIFF file at all")
    with pytest.raises(SourceError, match=r"bad.wav.*not a readable WAV"):
        WavSource(path, 16000).open()


def test_make_audio_source_follows_the_settings(tmp_path: Path) -> None:
    """kind none gives no source; tone/noise/wav give the matching protocol object."""
    assert make_audio_source(AudioSettings()) is None
    tone = make_audio_source(AudioSettings(kind="tone", sample_rate=8000, freq_hz=100))
    assert isinstance(tone, ToneSource) and isinstance(tone, AudioSource)
    assert tone.describe() == {
        "kind": "tone",
        "sample_rate": 8000,
        "freq_hz": 100.0,
        "amplitude": 0.3,
    }
    assert isinstance(make_audio_source(AudioSettings(kind="noise")), NoiseSource)
    wav = make_audio_source(AudioSettings(kind="wav", path=str(tmp_path / "x.wav")))
    assert isinstance(wav, WavSource) and wav.sample_rate == 16000
