"""Secret values in the configuration: a literal, `env:VAR` or `file:PATH`.

Resolved once when the configuration is loaded, so a missing variable or unreadable file is
a configuration error naming the key, not a failure at the first delivery. The value lives
in a `Secret`: its repr and str are masked, so no log line, error or config repr shows it;
only `get_secret_value()`, called where a request is built, does.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Final, Self

_MASK: Final = "**********"
_PLACEHOLDERS: ContextVar[bool] = ContextVar("secret_placeholders", default=False)


@contextmanager
def placeholders_for_missing() -> Iterator[None]:
    """Load a configuration for a command that never uses a secret (`spool list|replay|
    purge` need only the sinks' names): a secret that cannot be resolved becomes an empty
    placeholder instead of a configuration error, so the spool can be inspected without the
    sinks' credentials in the environment."""
    token = _PLACEHOLDERS.set(True)
    try:
        yield
    finally:
        _PLACEHOLDERS.reset(token)


def placeholders_active() -> bool:
    """Whether missing credentials are tolerated right now (see `placeholders_for_missing`);
    certificate files (`bridge.infra.tls`) follow the same rule."""
    return _PLACEHOLDERS.get()


class Secret:
    """A string that does not show itself (its repr and str are a mask)."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        return self._value

    @classmethod
    def from_config(cls, value: object) -> Self:
        """Resolve a configured literal, `env:VAR` or `file:PATH` (see bridge.validation)."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, str):
            raise ValueError("must be a string: a literal, env:VAR or file:PATH")
        if value.startswith("env:"):
            var = value[4:]
            if var not in os.environ:
                if _PLACEHOLDERS.get():
                    return cls("")
                raise ValueError(f"environment variable {var} is not set")
            return cls(os.environ[var])
        if value.startswith("file:"):
            path = Path(value[5:])
            try:
                return cls(path.read_text(encoding="utf-8").strip())
            except OSError as exc:
                if _PLACEHOLDERS.get():
                    return cls("")
                raise ValueError(f"cannot read secret file {path}: {exc.strerror}") from exc
        return cls(value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash(self._value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}('{_MASK}')"

    def __str__(self) -> str:
        return _MASK
