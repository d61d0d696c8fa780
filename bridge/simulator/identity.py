"""The VM identity the simulator serves: one identity per simulated provider (its type and
the vendor's names for its fields live in the provider's part, `SimulatedProvider`).

Kept separate so scenarios (e.g. the vendor's WestNO_0 freeze example) and callers can
override single fields without restating the whole identity.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any

from .part import names, part, parts, spelled


class Identity:
    """`identity.<provider>`: each provider's identity (its defaults unless given)."""

    def __init__(self, **by_name: Any) -> None:
        unknown = set(by_name) - set(names())
        if unknown:
            raise TypeError(f"no simulated provider {sorted(unknown)}")
        self._by_name = {p.name: by_name.get(p.name) or p.identity_type() for p in parts()}

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_by_name"][name]
        except KeyError:
            raise AttributeError(name) from None

    def replace(self, name: str, identity: Any) -> Identity:
        """This identity with `name`'s replaced."""
        return Identity(**(self._by_name | {name: identity}))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Identity) and other._by_name == self._by_name

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={value!r}" for name, value in self._by_name.items())
        return f"Identity({inner})"


def _apply(obj: Any, overrides: dict[str, Any], aliases: Mapping[str, str]) -> Any:
    allowed = {f.name for f in fields(obj)}
    clean: dict[str, Any] = {}
    for key, value in overrides.items():
        name = aliases.get(key, key)
        if name not in allowed:
            raise ValueError(f"unknown identity field {key!r} (allowed: {sorted(allowed)})")
        clean[name] = value
    return replace(obj, **clean)


def merge_identity(base: Identity, overrides: Identity | dict[str, Any] | None) -> Identity:
    """Return ``base`` with ``overrides`` ({"gce": {...}, "azure": {...}, ...})."""
    if overrides is None:
        return base
    if isinstance(overrides, Identity):
        return overrides
    unknown = set(overrides) - set(names())
    if unknown:
        tables = spelled(names(), "and")
        raise ValueError(f"identity overrides take {tables} tables, not {unknown}")
    merged = {
        name: _apply(
            getattr(base, name), dict(overrides.get(name, {})), part(name).identity_aliases
        )
        for name in names()
    }
    return Identity(**merged)
