"""What a `doctor` check reports: a verdict, what was seen and, when wrong, the fix.

Here, below every package, so that each component keeps its own checks beside it (the
coordination engine's, a provider's) and `bridge.surface.doctor` only runs and renders them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Verdict = Literal["ok", "warn", "fail", "skip"]


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    verdict: Verdict
    detail: str
    fix: str = ""
