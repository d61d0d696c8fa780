"""The `[coordination]` table of the configuration (see docs/coordination.md).

Kept apart from bridge/config.py, which only refers to it, so the coordination feature
stays in its own package.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import msgspec

from bridge.infra.secrets import Secret
from bridge.infra.validation import FieldError, HttpUrl

GroupChoice = str  # "scale-set", "zone", or a literal group name


class Coordination(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """Where the budget is kept and how big it is."""

    backend: Literal["etcd"] = "etcd"
    #: The etcd client URLs (the JSON gateway is served on the client port).
    endpoints: Annotated[tuple[HttpUrl, ...], msgspec.Meta(min_length=1)]
    #: `scale-set` (the VM's scale set), `zone` (its zone, else its region) or a literal name.
    group: Annotated[str, msgspec.Meta(min_length=1)] = "scale-set"
    #: How `group = "zone"` names an Azure zone: `reported` (as IMDS reports it: `2` is one
    #: group across every region) or `fleet` (`<location>-<zone>`, as the fleet files it).
    #: The etcd keys change with it, so every member of a group switches at once
    #: (docs/coordination.md, "Zone names"); GCE, AWS and zoneless VMs are named alike.
    zone_naming: Literal["reported", "fleet"] = "reported"
    #: At most this many members of the group in a disruptive action at once.
    budget: Annotated[int, msgspec.Meta(ge=1)] = 1
    #: Seconds; the lease is renewed every third of it while a slot is held.
    lease_ttl: Annotated[int, msgspec.Meta(ge=2, le=3600)] = 60
    #: etcd cannot be reached: act without a slot, or keep waiting (until the deadline).
    on_unavailable: Literal["proceed", "wait"] = "wait"
    #: Every key the bridge writes starts with this.
    prefix: str = "/maintenance-bridge/"
    #: The holder's name in etcd; default: the VM's name.
    member: str = ""
    #: Seconds between two attempts while waiting for a slot.
    poll_interval: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    #: Seconds for one etcd request.
    request_timeout: Annotated[float, msgspec.Meta(gt=0)] = 5.0
    #: etcd authentication (`/v3/auth/authenticate`): a user and its password.
    username: str | None = None
    password: Secret | None = None
    #: TLS: the CA of the etcd servers (default: the public CAs) and a client certificate.
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    def __post_init__(self) -> None:
        if (self.username is None) != (self.password is None):
            raise FieldError("password", "username and password go together")
        if self.key_file is not None and self.cert_file is None:
            raise FieldError("cert_file", "key_file needs cert_file")
        if not self.prefix.endswith("/"):
            raise FieldError("prefix", "must end with /")
