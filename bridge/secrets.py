"""Secret values in the configuration: a literal, `env:VAR` or `file:PATH`.

Resolved once when the configuration is loaded, so a missing variable or unreadable file is
a configuration error naming the key, not a failure at the first delivery. The value lives
in a `pydantic.SecretStr`: its repr and str are masked and it is never logged.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator, SecretStr


def resolve_secret(value: object) -> SecretStr:
    if isinstance(value, SecretStr):
        return value
    if not isinstance(value, str):
        raise ValueError("must be a string: a literal, env:VAR or file:PATH")
    if value.startswith("env:"):
        var = value[4:]
        if var not in os.environ:
            raise ValueError(f"environment variable {var} is not set")
        return SecretStr(os.environ[var])
    if value.startswith("file:"):
        path = Path(value[5:])
        try:
            return SecretStr(path.read_text(encoding="utf-8").strip())
        except OSError as exc:
            raise ValueError(f"cannot read secret file {path}: {exc.strerror}") from exc
    return SecretStr(value)


Secret = Annotated[SecretStr, BeforeValidator(resolve_secret)]
