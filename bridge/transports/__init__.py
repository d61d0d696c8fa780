"""What a sink and a fleet source share about one wire, one module a wire.

The sidecars' sinks write events onto a bus or an HTTP endpoint; the fleet service's
sources read them back. Whatever both sides must agree on lives here, written once, so that
neither imports the other: `kafka_binding` (the CloudEvents Kafka binding and the message
key) and `kafka_connection` (brokers, presets, SASL and TLS as librdkafka settings),
`eventhubs` (reaching a hub and the AMQP binding), `pubsub` (the Pub/Sub binding's
attributes), `webhook_signing` (Standard Webhooks signatures, made and verified).

A floor just above `bridge.infra`, beside the contract and the sink plug-in surface: these
modules import the infrastructure (and `bridge.sinkapi` for a configuration's base) only,
and their SDKs only inside the functions that need them.
"""
