"""The sidecar's instance credential on each wire: a message-level attribute named
`bridgecredential` in both content modes, read back by the fleet's side of the binding, and
never part of the event (the event a receiver decodes is the one without a credential)."""

from __future__ import annotations

import pytest

from bridge.infra.credential import ATTRIBUTE
from bridge.transports import eventhubs, kafka_binding, pubsub
from tests.factories import sample_events

TOKEN = "eyJhbGciOiJIUzI1NiJ9." + "x" * 400 + ".sig"


@pytest.mark.parametrize("mode", ["binary", "structured"])
def test_kafka_carries_it_as_a_header_outside_the_event(mode: kafka_binding.Mode) -> None:
    (event,) = sample_events(1)
    plain = kafka_binding.to_record(event, mode)
    carried = kafka_binding.to_record(event, mode, TOKEN)
    assert (ATTRIBUTE, TOKEN.encode()) in carried.headers
    assert kafka_binding.record_credential(carried.headers) == TOKEN
    assert kafka_binding.record_credential(plain.headers) is None
    assert carried.value == plain.value
    assert kafka_binding.to_structured_json(
        carried.headers, carried.value, carried.key
    ) == kafka_binding.to_structured_json(plain.headers, plain.value, plain.key)


def test_kafka_bytes_that_are_not_text_come_back_as_text_that_cannot_verify() -> None:
    assert kafka_binding.record_credential([(ATTRIBUTE, b"\xff\xfe")]) == "\ufffd\ufffd"


def test_pubsub_carries_it_as_an_attribute_within_the_limits_outside_the_event() -> None:
    (event,) = sample_events(1)
    data, attributes = pubsub.binary_attributes(event)
    carried = pubsub.with_credential(attributes, TOKEN)
    assert pubsub.fits_attribute_limits(carried) is None
    assert pubsub.message_credential(carried) == TOKEN
    assert pubsub.message_credential(attributes) is None
    assert pubsub.message_event(data, carried) == pubsub.message_event(data, attributes)


@pytest.mark.parametrize("mode", ["binary", "structured"])
def test_eventhubs_carries_it_as_an_application_property_outside_the_event(mode: str) -> None:
    (event,) = sample_events(1)
    plain = eventhubs.to_event_data(event, mode)
    carried = eventhubs.to_event_data(event, mode, TOKEN)
    assert eventhubs.event_credential(carried) == TOKEN
    assert eventhubs.event_credential(plain) is None
    assert eventhubs.event_body(carried) == eventhubs.event_body(plain)
