"""``StrEnum``: members that are their values as strings (``str(m) == m.value``, ``f"{m}"`` too).

The standard library's ``enum.StrEnum`` from Python 3.11; on Python 3.10 the same behaviour from ``str`` and
``Enum`` (the members here are given their values explicitly, so ``auto()``'s lower-casing is not needed).
"""

from __future__ import annotations

import sys
from enum import Enum

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # Python 3.10

    class StrEnum(str, Enum):
        """Python 3.11's ``enum.StrEnum`` for explicit values."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return str(self.value).__format__(spec)


__all__ = ["StrEnum"]
