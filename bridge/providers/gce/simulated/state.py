"""State of the simulated GCE metadata server and how each key is rendered.

The store is a flat map of key paths (``instance/maintenance-event``) to string values;
directories are implied by the paths, as on the real server.  Every change bumps a per-key
version so ETags change on *every* change (even A -> B -> A), which is what makes
``wait_for_change`` + ``last_etag`` work.  ``instance/upcoming-maintenance`` is special: it is a
JSON object whose shape and whose "nothing scheduled" rendering are switchable quirks, because
Google's documentation and observed servers disagree.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class GceIdentity:
    project_id: str = "sim-project"
    project_number: int = 123456789012
    zone: str = "us-central1-a"
    instance_id: int = 4520031799277582256
    instance_name: str = "sim-vm-1"
    machine_type: str = "e2-standard-4"
    #: The VM's service account: "default" (the project's default compute account), an
    #: email, or "" for none (then the identity endpoint answers 404, as on a VM without one).
    service_account: str = "default"

    @property
    def service_account_email(self) -> str:
        if self.service_account == "default":
            return f"{self.project_number}-compute@developer.gserviceaccount.com"
        return self.service_account

    @property
    def zone_path(self) -> str:
        """``instance/zone`` as the real server renders it."""
        return f"projects/{self.project_number}/zones/{self.zone}"

    @property
    def hostname(self) -> str:
        return f"{self.instance_name}.{self.zone}.c.{self.project_id}.internal"


UPCOMING_KEY = "instance/upcoming-maintenance"
MAINTENANCE_KEY = "instance/maintenance-event"
NO_NOTIFICATIONS_ERROR = {"error": "no notifications have been received yet, try again later"}

UpcomingNone = Literal["empty-object", "NONE", "404", "503"]
UpcomingCase = Literal["camel", "snake"]
_UPCOMING_NONE_VALUES = ("empty-object", "NONE", "404", "503")
_UPCOMING_CASE_VALUES = ("camel", "snake")

# canonical (snake) field -> camelCase name, in the order of Google's maintenance doc example
_CAMEL = {
    "type": "maintenanceType",
    "can_reschedule": "canReschedule",
    "latest_window_start_time": "latestWindowStartTime",
    "maintenance_status": "maintenanceStatus",
    "window_end_time": "windowEndTime",
    "window_start_time": "windowStartTime",
}
_SNAKE_ORDER = (
    "type",
    "can_reschedule",
    "latest_window_start_time",
    "maintenance_status",
    "window_start_time",
    "window_end_time",
    "maintenance_reasons",
)
_FROM_CAMEL = {v: k for k, v in _CAMEL.items()} | {"maintenanceReasons": "maintenance_reasons"}


@dataclass
class Rendered:
    """One HTTP answer for a key: status, body, content type and the change tag.

    ``tag`` identifies the representation for long-poll comparisons; it is sent as the
    ``ETag`` header only on 200 answers.
    """

    status: int
    body: str
    content_type: str
    tag: str


def etag_for(*parts: object) -> str:
    """16 lowercase hex chars, a deterministic function of the value and its version."""
    raw = "\0".join(str(p) for p in parts).encode()
    return hashlib.sha256(raw).hexdigest()[:16]


class GceQuirks:
    """Vendor behaviors that are not settled; switch them live (changes wake long-polls)."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        self._on_change = on_change
        self._upcoming_none: UpcomingNone = "empty-object"
        self._upcoming_case: UpcomingCase = "camel"

    @property
    def upcoming_none(self) -> UpcomingNone:
        """How "nothing scheduled" is rendered: ``{}``, body ``NONE``, 404 or 503."""
        return self._upcoming_none

    @upcoming_none.setter
    def upcoming_none(self, value: UpcomingNone) -> None:
        if value not in _UPCOMING_NONE_VALUES:
            raise ValueError(f"upcoming_none must be one of {_UPCOMING_NONE_VALUES}")
        self._upcoming_none = value
        self._on_change()

    @property
    def upcoming_case(self) -> UpcomingCase:
        """Field naming of upcoming-maintenance: ``camel`` (maintenance doc) or ``snake``."""
        return self._upcoming_case

    @upcoming_case.setter
    def upcoming_case(self, value: UpcomingCase) -> None:
        if value not in _UPCOMING_CASE_VALUES:
            raise ValueError(f"upcoming_case must be one of {_UPCOMING_CASE_VALUES}")
        self._upcoming_case = value
        self._on_change()

    def as_dict(self) -> dict[str, Any]:
        return {"upcoming_none": self._upcoming_none, "upcoming_case": self._upcoming_case}

    def update(self, values: dict[str, Any]) -> None:
        for key, value in values.items():
            if key not in ("upcoming_none", "upcoming_case"):
                raise ValueError(f"unknown GCE quirk {key!r}")
            setattr(self, key, value)


def default_values(ident: GceIdentity) -> dict[str, str]:
    """The keys a fresh simulated VM serves."""
    return {
        "instance/id": str(ident.instance_id),
        "instance/name": ident.instance_name,
        "instance/hostname": ident.hostname,
        "instance/zone": ident.zone_path,
        "instance/machine-type": f"projects/{ident.project_number}/machineTypes/"
        f"{ident.machine_type}",
        "instance/cpu-platform": "Intel Broadwell",
        MAINTENANCE_KEY: "NONE",
        "instance/preempted": "FALSE",
        "instance/scheduling/automatic-restart": "TRUE",
        "instance/scheduling/on-host-maintenance": "MIGRATE",
        "instance/scheduling/preemptible": "FALSE",
        "instance/scheduling/provisioning-model": "STANDARD",
        "project/project-id": ident.project_id,
        "project/numeric-project-id": str(ident.project_number),
    }


def normalize_upcoming(data: dict[str, Any]) -> dict[str, Any]:
    """Accept camelCase or snake_case input; keep canonical snake_case with typed values."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = _FROM_CAMEL.get(key, key)
        if name not in _SNAKE_ORDER:
            raise ValueError(f"unknown upcoming-maintenance field {key!r}")
        if name == "can_reschedule" and isinstance(value, str):
            value = value.lower() == "true"
        out[name] = value
    out.setdefault("type", "SCHEDULED")
    out.setdefault("maintenance_status", "PENDING")
    out.setdefault("can_reschedule", False)
    return out


def render_upcoming_body(upcoming: dict[str, Any], case: UpcomingCase) -> str:
    """Serialize a scheduled maintenance in the requested field case."""
    if case == "camel":
        obj: dict[str, Any] = {}
        for snake, camel in _CAMEL.items():
            if snake not in upcoming:
                continue
            value = upcoming[snake]
            # the maintenance doc shows canReschedule as the *string* "true"
            obj[camel] = ("true" if value else "false") if snake == "can_reschedule" else value
        return json.dumps(obj)
    snake_obj = {k: upcoming[k] for k in _SNAKE_ORDER if k in upcoming}
    snake_obj.setdefault("maintenance_reasons", [])
    return json.dumps(snake_obj)


@dataclass
class GceState:
    """Everything the GCE side serves; mutate it only through these methods.

    Every mutator fires ``signal`` so hanging long-polls re-evaluate immediately.
    """

    identity: GceIdentity
    notify: Callable[[], None]
    values: dict[str, str] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    upcoming: dict[str, Any] | None = None
    upcoming_version: int = 0
    maintenance_event_watched: bool = False
    quirks: GceQuirks = field(init=False)

    def __post_init__(self) -> None:
        self.quirks = GceQuirks(self._quirk_changed)
        if not self.values:
            self.values = default_values(self.identity)

    def _quirk_changed(self) -> None:
        self.upcoming_version += 1
        self.notify()

    # -- live driving -------------------------------------------------------------------
    def set(self, key: str, value: str) -> None:
        """Set any key under ``computeMetadata/v1/`` (directories are created implicitly)."""
        key = key.strip("/")
        if key == UPCOMING_KEY:
            raise ValueError("use set_upcoming_maintenance() for instance/upcoming-maintenance")
        if not key:
            raise ValueError("empty key")
        value = str(value)
        if self.values.get(key) == value:
            return
        previous = self.values.get(key)
        self.values[key] = value
        self.versions[key] = self.versions.get(key, 0) + 1
        if key == MAINTENANCE_KEY and previous not in (None, "NONE") and value == "NONE":
            # the event is over: Compute Engine wants a fresh query before the next warning
            self.maintenance_event_watched = False
        self.notify()

    def delete(self, key: str) -> None:
        """Remove a key (it then answers 404)."""
        key = key.strip("/")
        if self.values.pop(key, None) is not None:
            self.versions[key] = self.versions.get(key, 0) + 1
            self.notify()

    def get(self, key: str) -> str | None:
        return self.values.get(key.strip("/"))

    def set_upcoming_maintenance(self, upcoming: dict[str, Any] | None) -> None:
        """Schedule (dict, camel or snake keys) or clear (None) the upcoming maintenance."""
        self.upcoming = None if upcoming is None else normalize_upcoming(upcoming)
        self.upcoming_version += 1
        self.notify()

    def mark_watched(self) -> None:
        """Record a direct query of instance/maintenance-event (the 60-second warning rule)."""
        self.maintenance_event_watched = True

    # -- rendering ------------------------------------------------------------------------
    def is_dir(self, path: str) -> bool:
        prefix = path.strip("/") + "/" if path.strip("/") else ""
        return any(k.startswith(prefix) for k in self._all_keys())

    def _all_keys(self) -> list[str]:
        keys = list(self.values)
        if self._upcoming_listed():
            keys.append(UPCOMING_KEY)
        return keys

    def _upcoming_listed(self) -> bool:
        return self.upcoming is not None or self.quirks.upcoming_none != "404"

    def has_value(self, key: str) -> bool:
        return key in self.values or (key == UPCOMING_KEY)

    def render_value(self, key: str) -> Rendered | None:
        """Answer for a leaf key, or None when the key does not exist."""
        if key == UPCOMING_KEY:
            return self._render_upcoming()
        if key not in self.values:
            return None
        value = self.values[key]
        tag = etag_for(key, value, self.versions.get(key, 0))
        return Rendered(200, value, "application/text", tag)

    def _render_upcoming(self) -> Rendered:
        version = self.upcoming_version
        if self.upcoming is not None:
            body = render_upcoming_body(self.upcoming, self.quirks.upcoming_case)
            return Rendered(200, body, "application/json", etag_for(UPCOMING_KEY, body, version))
        mode = self.quirks.upcoming_none
        if mode == "empty-object":
            return Rendered(200, "{}", "application/json", etag_for(UPCOMING_KEY, "{}", version))
        if mode == "NONE":
            return Rendered(
                200, "NONE", "application/text", etag_for(UPCOMING_KEY, "NONE", version)
            )
        if mode == "404":
            return Rendered(404, "", "text/html", etag_for(UPCOMING_KEY, "404", version))
        body = json.dumps(NO_NOTIFICATIONS_ERROR)
        return Rendered(503, body, "application/json", etag_for(UPCOMING_KEY, "503", version))

    def children(self, path: str) -> list[str]:
        """Direct children of a directory, sub-directories with a trailing slash."""
        prefix = path.strip("/") + "/" if path.strip("/") else ""
        names: list[str] = []
        for key in sorted(self._all_keys()):
            if not key.startswith(prefix):
                continue
            rest = key[len(prefix) :]
            name = rest.split("/", 1)[0] + ("/" if "/" in rest else "")
            if name not in names:
                names.append(name)
        return names

    def tree(self, path: str) -> dict[str, Any]:
        """Recursive JSON view of a directory, with the camelCase keys the real server uses."""
        prefix = path.strip("/") + "/" if path.strip("/") else ""
        out: dict[str, Any] = {}
        for name in self.children(path):
            full = prefix + name.rstrip("/")
            camel = _camel(name.rstrip("/"))
            if name.endswith("/"):
                out[camel] = self.tree(full)
            elif full == UPCOMING_KEY:
                if self.upcoming is not None:
                    out[camel] = json.loads(
                        render_upcoming_body(self.upcoming, self.quirks.upcoming_case)
                    )
            else:
                value = self.values[full]
                out[camel] = int(value) if full in _NUMERIC_KEYS and value.isdigit() else value
        return out

    def render_dir(self, path: str, *, recursive: bool, as_json: bool) -> Rendered:
        """Directory listing: text lines by default, JSON with alt=json or recursive=true."""
        if recursive:
            body = json.dumps(self.tree(path))
            ctype = "application/json"
        elif as_json:
            body = json.dumps(self.children(path))
            ctype = "application/json"
        else:
            body = "".join(name + "\n" for name in self.children(path))
            ctype = "application/text"
        return Rendered(200, body, ctype, etag_for(path, body, recursive, as_json))

    def snapshot(self) -> dict[str, Any]:
        return {
            "values": dict(self.values),
            "upcoming_maintenance": self.upcoming,
            "maintenance_event_watched": self.maintenance_event_watched,
            "quirks": self.quirks.as_dict(),
        }


_NUMERIC_KEYS = {"instance/id", "project/numeric-project-id"}


def _camel(name: str) -> str:
    head, *rest = name.split("-")
    return head + "".join(part.capitalize() for part in rest)
