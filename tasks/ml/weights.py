"""Reading torch weights from bytes with ``torch.load(weights_only=True)``, and saying in one line
why a file cannot be read.

Torch's own text for a refused file is a page long and suggests ``weights_only=False``, which
would run arbitrary code from the file; it never reaches a user. :class:`WeightsUnreadableError`
carries a short reason instead (the blocked global's name when there is one).
"""

from __future__ import annotations

import io
import pickle
import re
import zipfile
from typing import Any

_BLOCKED_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")
_UNPICKLER_ERROR = re.compile(r"WeightsUnpickler error:\s*(.+?)\s*(?:\n\n|$)", re.S)


class WeightsUnreadableError(ValueError):
    """The bytes are not a torch file that weights-only loading accepts."""


def load_weights(data: bytes) -> Any:
    """``torch.load(weights_only=True)`` of ``data`` onto the CPU; WeightsUnreadableError with a
    one-line reason when torch refuses or cannot parse it."""
    import torch

    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile) as exc:
        raise WeightsUnreadableError(refusal_reason(exc)) from None


def refusal_reason(exc: BaseException) -> str:
    """One line on why torch refused a file, without torch's advice to load it unsafely."""
    text = str(exc)
    blocked = _BLOCKED_GLOBAL.search(text)
    if blocked:
        return (
            f"it holds a pickled {blocked.group(1)}, which weights-only loading refuses "
            "(only tensors and plain Python types are read)"
        )
    detail = _UNPICKLER_ERROR.search(text)
    if detail:
        return f"it is not a weights-only torch file ({detail.group(1).splitlines()[0]})"
    first = text.strip().splitlines()[0].split(". ")[0] if text.strip() else ""
    if not first or "weights_only" in first:
        first = type(exc).__name__
    return f"it is not a readable torch file ({first[:200]})"
