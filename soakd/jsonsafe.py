"""JSON-safe copies of the values soakd stores and reports (vocabulary: numpy only).

``clean_json`` is shared by the store (the ``verdicts.evidence`` column) and the reports
(``soakd.report.json`` / ``junit``), so neither has to import the other.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def clean_json(o: Any) -> Any:
    """A JSON-safe copy: numpy scalars and arrays to Python, NaN/inf to None, unknown
    objects to str."""
    if isinstance(o, dict):
        return {str(k): clean_json(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [clean_json(v) for v in o]
    if isinstance(o, np.ndarray):
        return [clean_json(v) for v in o.tolist()]
    if isinstance(o, np.generic):
        o = o.item()
    if isinstance(o, bool) or o is None or isinstance(o, int | str):
        return o
    if isinstance(o, float):
        return o if np.isfinite(o) else None
    return str(o)
