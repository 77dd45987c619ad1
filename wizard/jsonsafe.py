"""Values made JSON-safe: NaN/Inf as strings, tensors and numpy values as Python numbers (or, past a size
limit, as a short description), anything else unknown as its text."""

from __future__ import annotations

import math
from typing import Any


def jsonable(value: Any, limit: int | None = None) -> Any:
    """``value`` with every float finite or a string, every tensor/array a list (``limit``: one of more values
    than this becomes ``"tensor[shape]"``), every dict key a string."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v, limit) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, limit) for v in value]
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if hasattr(value, "tolist"):
        size = value.numel() if hasattr(value, "numel") else getattr(value, "size", 0)
        if limit is not None and isinstance(size, int) and size > limit:
            return f"tensor{list(value.shape)}"
        return jsonable(value.tolist(), limit)
    return str(value)


def plain_data(value: Any) -> Any:
    """``value`` as plain Python data (tensors and arrays as nested lists, tuples as lists), floats kept as they
    are (NaN included): what a probe artifact holds, ready to be rendered or sent."""
    if isinstance(value, dict):
        return {str(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, range, set, frozenset)):
        return [plain_data(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "tolist"):
        return plain_data(value.tolist())
    return str(value)
