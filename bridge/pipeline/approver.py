"""What the actions need of a provider that can approve maintenance early: one call.

Azure's Scheduled Events take a `StartRequests` POST (bridge/providers/azure/watcher.py);
the actions (bridge/actions/engine.py) decide when to send one. Both sides import this
module, so the provider does not depend on the policy and the policy not on the provider.
"""

from __future__ import annotations

from typing import Protocol


class ApprovalRejected(Exception):
    """The metadata service refused an approval for good (4xx: the event is unknown or over)."""


class Approver(Protocol):
    async def approve(self, event_id: str) -> None:
        """Ask the platform to start the event now; `ApprovalRejected` when it never will."""
