"""How to reach a Kafka topic: the connection keys a producer and a consumer share.

`Connection` holds brokers, topic, presets (`eventhubs`: Event Hubs' Kafka endpoint from a
connection string; `confluent-cloud`), SASL, TLS and further librdkafka `options`, with one
set of checks; `connection_settings` turns it into librdkafka's settings. The Kafka sink's
`Config` (sinks/kafka.py) and the fleet's `kafka` source (`bridge.fleet.kafka_config`)
extend it, so both sides reach a cluster the same way and check the same mistakes.

A `SinkConfig` (type and name, unknown keys refused) because the sink's configuration is
one; the source's inherits it as well. No Kafka client here: confluent-kafka is imported
where a producer or a consumer is built.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final, Literal

import msgspec

from bridge.infra.secrets import Secret
from bridge.infra.validation import FieldError
from bridge.sinkapi import SinkConfig

#: Event Hubs' Kafka endpoint: the namespace host on port 9093, SASL PLAIN over TLS with the
#: literal user ``$ConnectionString``; it drops idle connections after 240 s, so metadata
#: is refreshed and idle connections closed before that. Only gzip compression is accepted.
EVENTHUBS_PORT: Final = 9093
EVENTHUBS_USER: Final = "$ConnectionString"
EVENTHUBS_OPTIONS: Final[dict[str, str | int | bool]] = {
    "metadata.max.age.ms": 180000,
    "connections.max.idle.ms": 180000,
    "socket.keepalive.enable": True,
}
#: librdkafka settings a connection owns: delivery guarantees and secrets have their own keys.
MANAGED_OPTIONS: Final = frozenset(
    {
        "bootstrap.servers",
        "enable.idempotence",
        "acks",
        "message.timeout.ms",
        "delivery.timeout.ms",
        "message.max.bytes",
        "security.protocol",
        "sasl.mechanism",
        "sasl.mechanisms",
        "sasl.username",
        "sasl.password",
        "sasl.oauthbearer.client.secret",
        "ssl.key.password",
        "ssl.keystore.password",
        "ssl.key.pem",
    }
)
_EVENTHUBS_ENDPOINT: Final = re.compile(r"(?:^|;)\s*Endpoint\s*=\s*sb://([^/;:]+)", re.IGNORECASE)
_ENTITY_PATH: Final = re.compile(r"(?:^|;)\s*EntityPath\s*=\s*([^;]+)", re.IGNORECASE)

Protocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
Mechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]


class Connection(SinkConfig, frozen=True, kw_only=True):
    """How to reach a topic: brokers, presets, SASL, TLS; the keys the sink and the fleet's
    `kafka` source (`bridge.fleet.kafka_config`) share, with one set of checks."""

    type: str = "kafka"
    #: ``host:port`` of one or more brokers; derived from the connection string for Event Hubs.
    bootstrap_servers: list[str] | None = None
    #: The topic (for Event Hubs: the event hub; defaults to the connection string's EntityPath).
    topic: str | None = None
    preset: Literal["eventhubs", "confluent-cloud"] | None = None
    #: Default PLAINTEXT, or SASL_SSL with a preset or a SASL mechanism.
    security_protocol: Protocol | None = None
    sasl_mechanism: Mechanism | None = None
    username: str | None = None
    password: Secret | None = None
    #: Event Hubs preset: the namespace (or hub) connection string, as the SASL password.
    connection_string: Secret | None = None
    #: PEM file of the CAs that sign the brokers' certificates (default: the system's).
    ca_file: Path | None = None
    #: OAUTHBEARER through an OIDC client-credentials grant.
    oauth_token_url: str | None = None
    oauth_client_id: str | None = None
    oauth_client_secret: Secret | None = None
    oauth_scope: str | None = None
    #: Further librdkafka settings (not those listed in MANAGED_OPTIONS).
    options: dict[str, str | int | float | bool] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in self.options:
            if key in MANAGED_OPTIONS or key.endswith((".password", ".secret")):
                raise FieldError(
                    "options",
                    f"{key!r} is set by the sink: use its own keys (bootstrap_servers, "
                    "username/password, ...); delivery guarantees cannot be turned off",
                )
        if self.preset == "eventhubs":
            self._check_eventhubs()
        elif self.preset == "confluent-cloud" and (self.username is None or self.password is None):
            raise ValueError(
                "preset confluent-cloud needs username (the API key) and password "
                "(the API secret, e.g. env:CONFLUENT_API_SECRET)"
            )
        if self.preset != "eventhubs":
            if not self.bootstrap_servers:
                raise FieldError("bootstrap_servers", "required: one or more host:port")
            if self.topic is None:
                raise FieldError("topic", "required")
            if self.connection_string is not None:
                raise FieldError("connection_string", 'only with preset = "eventhubs"')
        for server in self.bootstrap_servers or []:
            host, _, port = server.rpartition(":")
            if not host or not port.isdigit():
                raise FieldError("bootstrap_servers", f"{server!r} is not host:port")
        self._check_security()

    def _check_eventhubs(self) -> None:
        if self.connection_string is None:
            raise FieldError("connection_string", 'required with preset = "eventhubs"')
        text = self.connection_string.get_secret_value()
        if not _EVENTHUBS_ENDPOINT.search(text):
            raise FieldError(
                "connection_string", "has no Endpoint=sb://<namespace>.servicebus.windows.net/"
            )
        if self.topic is None and not _ENTITY_PATH.search(text):
            raise FieldError(
                "topic", "required: the event hub (the connection string has no EntityPath)"
            )
        for key in ("username", "password", "sasl_mechanism", "security_protocol"):
            if getattr(self, key) is not None:
                raise FieldError(key, 'set by preset = "eventhubs" (from the connection string)')

    def _check_security(self) -> None:
        mechanism = self.sasl_mechanism
        if self.security_protocol in ("PLAINTEXT", "SSL") and mechanism is not None:
            raise FieldError("sasl_mechanism", "needs a SASL_* security_protocol")
        if mechanism == "OAUTHBEARER":
            if not (self.oauth_token_url and self.oauth_client_id and self.oauth_client_secret):
                raise ValueError(
                    "sasl_mechanism OAUTHBEARER needs oauth_token_url, oauth_client_id and "
                    "oauth_client_secret"
                )
        elif mechanism is not None and (self.username is None or self.password is None):
            raise ValueError(f"sasl_mechanism {mechanism} needs username and password")

    def target(self) -> tuple[list[str], str]:
        """The bootstrap servers and the topic, presets resolved."""
        if self.preset == "eventhubs":
            assert self.connection_string is not None
            text = self.connection_string.get_secret_value()
            endpoint = _EVENTHUBS_ENDPOINT.search(text)
            assert endpoint is not None
            entity = _ENTITY_PATH.search(text)
            topic = self.topic or (entity.group(1).strip() if entity else "")
            return [f"{endpoint.group(1)}:{EVENTHUBS_PORT}"], topic
        assert self.bootstrap_servers is not None
        assert self.topic is not None
        return list(self.bootstrap_servers), self.topic


def connection_settings(config: Connection) -> dict[str, Any]:
    """librdkafka's settings to reach the brokers (a producer's or a consumer's), secrets
    included: build the client, then drop them."""
    servers, _ = config.target()
    settings: dict[str, Any] = {"bootstrap.servers": ",".join(servers)}
    if config.preset == "eventhubs":
        assert config.connection_string is not None
        settings.update(EVENTHUBS_OPTIONS)
        settings.update(
            {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "PLAIN",
                "sasl.username": EVENTHUBS_USER,
                "sasl.password": config.connection_string.get_secret_value(),
            }
        )
    else:
        mechanism = config.sasl_mechanism or ("PLAIN" if config.preset else None)
        protocol = config.security_protocol or ("SASL_SSL" if mechanism else "PLAINTEXT")
        settings["security.protocol"] = protocol
        if mechanism is not None:
            settings["sasl.mechanism"] = mechanism
        if mechanism == "OAUTHBEARER":
            assert config.oauth_client_secret is not None
            settings.update(
                {
                    "sasl.oauthbearer.method": "oidc",
                    "sasl.oauthbearer.token.endpoint.url": config.oauth_token_url,
                    "sasl.oauthbearer.client.id": config.oauth_client_id,
                    "sasl.oauthbearer.client.secret": config.oauth_client_secret.get_secret_value(),
                }
            )
            if config.oauth_scope:
                settings["sasl.oauthbearer.scope"] = config.oauth_scope
        elif mechanism is not None:
            assert config.password is not None
            settings["sasl.username"] = config.username
            settings["sasl.password"] = config.password.get_secret_value()
    if config.ca_file is not None:
        settings["ssl.ca.location"] = str(config.ca_file)
    settings.update(config.options)
    return settings
