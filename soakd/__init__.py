"""soakd: soak-test and telemetry daemon for real-time video and multimodal model inference."""

__version__ = "0.1.0"
