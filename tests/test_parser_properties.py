"""Property: whatever a metadata service answers, no exception escapes a watcher's parser and
every event it produces validates against `schemas/`.

Hypothesis writes the answers: arbitrary bytes, arbitrary JSON, and documents of the right
shape whose every field may hold a value of any JSON type. They go through the functions the
watchers run on every answer (Azure `parse_document` + `diff`, GCE `parse_upcoming` +
`_apply`), in sequences, so that the transitions (scheduled, started, vanished) and the
checkpoints they write are exercised too. No network: the watchers' HTTP clients are built
but never used.
"""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.config import parse_config
from bridge.pipeline.events import to_cloudevent
from bridge.pipeline.model import Instance, Notice, Provider
from bridge.providers.azure import watcher as azure
from bridge.providers.gce import watcher as gce
from tests.support import assert_valid

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
PROPERTIES = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
times = st.sampled_from(
    [
        "Mon, 23 Nov 2026 12:30:00 GMT",
        "Mon, 23 Nov 2026 12:30:00",
        "2026-11-23T10:00:00",
        "2026-11-23T10:00:00Z",
        "2026-11-23T10:00:00.123+02:00",
        "0001-01-01T00:00:00+01:00",
        "9999-12-31T23:59:59-05:00",
        "",
        "not-a-time",
    ]
)


def either(usual: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly what the vendor documents, sometimes (one in four) any JSON value at all.

    (Not `one_of(usual, json_values)`: that flattens `json_values` into many branches and
    would almost never produce a document of the right shape.)
    """
    return st.integers(min_value=0, max_value=3).flatmap(
        lambda roll: json_values if roll == 0 else usual
    )


azure_events = st.fixed_dictionaries(
    {
        "EventId": either(st.sampled_from(["E1", "E2", "e1", ""])),
        "Resources": either(st.lists(either(st.sampled_from(["vm-1", "VM-1", "vm-2"])))),
        "EventStatus": either(st.sampled_from(["Scheduled", "Started", "Other"])),
        "EventType": either(st.sampled_from(["Freeze", "Reboot", "Redeploy", "Terminate"])),
        "ResourceType": either(st.just("VirtualMachine")),
        "NotBefore": either(times),
        "Description": either(st.text(max_size=20)),
        "EventSource": either(st.sampled_from(["Platform", "User"])),
        "DurationInSeconds": either(
            st.integers(min_value=-1, max_value=10**6) | st.sampled_from(["30", " 7 ", "²", "-1"])
        ),
    },
    optional={"Extra": json_values},  # a field added by a later api-version
)
azure_documents = either(
    st.fixed_dictionaries(
        {
            "DocumentIncarnation": either(st.integers(min_value=0, max_value=10**6)),
            "Events": either(st.lists(either(azure_events), max_size=4)),
        }
    ),
)
upcoming_fields = st.sampled_from(
    [*gce._FIELDS, *gce._FIELDS.values(), "unknownField"]  # both cases, and an unknown one
)
upcoming_payloads = st.dictionaries(
    upcoming_fields,
    either(times | st.sampled_from(["SCHEDULED", "PENDING", "ONGOING", "true", "false"])),
    max_size=6,
)


def _instance(provider: Provider) -> Instance:
    name = "vm-1"
    return Instance(provider, "1234", name, f"//test/{provider.value}/{name}", f"vms/{name}")


def _azure_watcher(checkpoint: dict[str, Any] | None = None) -> azure.AzureWatcher:
    config = parse_config({}).source.azure
    watcher = azure.AzureWatcher(azure.new_client(config), config, checkpoint, clock=lambda: NOW)
    watcher.instance = _instance(Provider.AZURE)
    return watcher


def _gce_watcher() -> gce.GceWatcher:
    config = parse_config({}).source.gce
    watcher = gce.GceWatcher(gce.new_client(config), config, clock=lambda: NOW)
    watcher.instance = _instance(Provider.GCE)
    return watcher


def _all_valid(notices: list[Notice]) -> None:
    for notice in notices:
        assert_valid(to_cloudevent(notice))


def _azure_body(document: Any) -> bytes:
    return json.dumps(document).encode()


@PROPERTIES
@given(st.binary(max_size=200))
def test_azure_any_bytes_are_a_document_or_a_value_error(body: bytes) -> None:
    with contextlib.suppress(ValueError):
        azure.parse_document(body)


@PROPERTIES
@given(st.lists(azure_documents, min_size=1, max_size=4), st.booleans())
def test_azure_any_documents_give_valid_events_only(documents: list[Any], restart: bool) -> None:
    watcher = _azure_watcher()
    for number, document in enumerate(documents):
        try:
            parsed = azure.parse_document(_azure_body(document))
        except ValueError:
            continue  # the client retries a malformed document
        _all_valid(watcher.diff(parsed.incarnation, parsed.events))
        if restart and number == 0:
            # The checkpoint written with whatever came in must load after a restart.
            watcher = _azure_watcher(json.loads(json.dumps(watcher.checkpoint())))
    _all_valid(watcher.diff(1, []))  # everything vanishes


@PROPERTIES
@given(st.integers(min_value=0, max_value=600), st.text(max_size=80))
def test_gce_any_upcoming_answer_is_a_payload_or_a_value_error(status: int, body: str) -> None:
    with contextlib.suppress(ValueError):
        gce.parse_upcoming(status, body)


@PROPERTIES
@given(
    st.lists(either(st.none() | upcoming_payloads), min_size=1, max_size=4),
    st.lists(st.sampled_from(["NONE", "MIGRATE_ON_HOST_MAINTENANCE", "ODD_VALUE"]), max_size=3),
)
def test_gce_any_values_give_valid_events_only(payloads: list[Any], flags: list[str]) -> None:
    watcher = _gce_watcher()
    for number, payload in enumerate(payloads):
        body = "NONE" if payload is None else json.dumps(payload)
        try:
            gce.parse_upcoming(200, body)
        except ValueError:
            continue  # the client retries an answer of no known shape
        _all_valid(watcher._apply(gce.UPCOMING, 200, body, f"etag-{number}"))
    for number, flag in enumerate(flags):
        _all_valid(watcher._apply(gce.MAINTENANCE_EVENT, 200, flag, f"flag-{number}"))
    _all_valid(watcher._apply(gce.UPCOMING, 404, "", None))
