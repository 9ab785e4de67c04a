"""A folder of images, one per frame, in natural name order (``f2`` before ``f10``), looped.

``open`` lists the folder and checks every file's signature with OpenCV (cheap: headers
only) and decodes the first one, so an empty folder or a non-image file fails before the run
with a ``SourceError`` naming it. An image that still cannot be decoded mid-run (truncated,
deleted) ends the run with ``SourceEnded`` naming the file. Images are decoded on each read,
nothing is cached, so memory stays flat however large the folder.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from soakd.config import SourceSettings
from soakd.errors import SourceError
from soakd.sources.base import SourceEnded, make_resize

IMAGE_SUFFIXES = frozenset(
    {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pnm"}
)
_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders embedded numbers by value: ``img2.png`` < ``img10.png``."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in _DIGITS.split(name) if p)


def list_images(folder: Path) -> list[Path]:
    """The image files of ``folder`` (by suffix, not recursive), in natural order."""
    files = [p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]
    return sorted(files, key=lambda p: natural_key(p.name))


class ImageFolderSource:
    """Images of one folder, shown one per frame."""

    def __init__(self, settings: SourceSettings, *, fps: float) -> None:
        if not settings.path:
            raise SourceError("source.path: required for an image folder")
        self.settings = settings
        self.folder = Path(settings.path)
        self.fps = fps
        self._resize = make_resize(settings)
        self.files: list[Path] = []
        self._i = 0
        self.loops = 0
        self.first_size: tuple[int, int] | None = None

    def open(self) -> None:
        if self.files:
            return
        folder = self.folder
        if not folder.is_dir():
            raise SourceError(f"source.path: image folder not found: {folder}")
        files = list_images(folder)
        if not files:
            suffixes = ", ".join(sorted(IMAGE_SUFFIXES))
            raise SourceError(f"image folder {folder}: no images in it (looked for {suffixes})")
        for f in files:
            if not cv2.haveImageReader(str(f)):
                raise SourceError(f"image folder {folder}: {f.name} is not an image OpenCV reads")
        first = self._decode(files[0], SourceError)
        self.first_size = (first.shape[1], first.shape[0])
        self.files = files

    @staticmethod
    def _decode(path: Path, error: type[Exception]) -> np.ndarray:
        img = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if img is None:
            raise error(f"image {path}: cannot be read or decoded")
        return img

    def read(self) -> tuple[np.ndarray, float | None]:
        if not self.files:
            self.open()
        i = self._i
        if i >= len(self.files):
            if not self.settings.loop:
                raise SourceEnded(
                    f"image folder {self.folder}: end after {len(self.files)} images (loop = false)"
                )
            i = 0
            self.loops += 1
        self._i = i + 1
        try:
            img = self._decode(self.files[i], SourceEnded)
        except SourceEnded:
            raise
        except Exception as exc:  # e.g. the file was deleted or is unreadable now
            raise SourceEnded(f"image {self.files[i]}: {type(exc).__name__}: {exc}") from exc
        return self._resize(img), None

    def close(self) -> None:
        """Nothing is held open between reads."""

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "images",
            "path": str(self.folder.resolve()),
            "count": len(self.files),
            "first_size": list(self.first_size) if self.first_size else None,
            "loop": self.settings.loop,
            "loops": self.loops,
            "resize": [self.settings.width, self.settings.height] if self.settings.resize else None,
        }
