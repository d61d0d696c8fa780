"""Turns parsed TOML into the typed configuration models (`msgspec.Struct`s), naming every
mistake by its key path.

`validate(Model, mapping)` is the one way to build a configuration model from data: the
bridge's own sections, every sink's `Config` (built-in or third-party) and the tests all go
through it. msgspec stops at the first error of a conversion, but a person fixing a file wants
every mistake at once, so each nested section and each entry of an array of tables is
converted on its own, and within one table a key found wrong is set aside and the rest
converted again. Errors that only follow from a key set aside (a required key missing, a
cross-key check seeing a default) are not reported.

msgspec's own messages (``Expected `float` >= 0.2 - at `$.poll_interval```) are rewritten in
the file's terms: ``source.azure.poll_interval: must be >= 0.2``.

A model's own checks live in `__post_init__` and raise `ValueError` (reported at the table's
path) or `FieldError` (reported at one key's path). Types msgspec does not know (`Path`,
`HttpUrl`, `bridge.infra.secrets.Secret`, a plugin's own) are built by `dec_hook`: any class with a
`from_config(value)` classmethod can be used as a field type.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal, Self, TypeVar
from urllib.parse import urlsplit

import msgspec
import msgspec.structs

Model = TypeVar("Model", bound=msgspec.Struct)
Loc = tuple[str | int, ...]


class ConfigError(Exception):
    """A configuration that cannot be used; `problems` lists `path: message` lines."""

    def __init__(self, problems: list[str], source: str = "configuration") -> None:
        self.problems = problems
        self.source = source
        super().__init__(f"{source}: " + "; ".join(problems))

    def render(self) -> str:
        lines = [f"invalid {self.source}:"]
        lines += [f"  {problem}" for problem in self.problems]
        return "\n".join(lines)


class FieldError(ValueError):
    """Raised by a model's `__post_init__` to blame one key rather than the whole table."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


class HttpUrl(str):
    """An absolute http:// or https:// URL with a host, kept as written (an empty path
    becomes `/`, the path HTTP sends for it)."""

    __slots__ = ()

    @classmethod
    def from_config(cls, value: object) -> Self:
        if not isinstance(value, str):
            raise ValueError("must be a string: an http:// or https:// URL")
        try:
            parts = urlsplit(value)
            _ = parts.port  # a port that is not a number raises ValueError
        except ValueError as exc:
            raise ValueError(f"not a valid URL: {exc}") from None
        if parts.scheme not in ("http", "https"):
            raise ValueError("must be an http:// or https:// URL")
        if not parts.hostname:
            raise ValueError("must name a host")
        return cls(value if parts.path else parts._replace(path="/").geturl())


def dec_hook(type_: type, value: object) -> object:
    """Builds the values of types msgspec does not know (see the module docstring)."""
    if type_ is Path:
        if not isinstance(value, str | Path):
            raise ValueError("must be a string (a path)")
        return Path(value)
    from_config = getattr(type_, "from_config", None)
    if from_config is None:
        raise NotImplementedError(f"no way to read a {type_.__name__} from the configuration")
    return from_config(value)


def validate(model: type[Model], data: object, source: str = "configuration") -> Model:
    """`data` as a `model`; raise `ConfigError` listing every problem."""
    problems: list[str] = []
    value = validate_into(problems, model, data)
    if value is None:
        raise ConfigError(problems, source)
    return value


def validate_into(
    problems: list[str], model: type[Model], data: object, at: Loc = ()
) -> Model | None:
    """`data` as a `model`, or None after appending a `path: message` line per problem to
    `problems` (paths start with `at`, the key path of `data` in the file)."""
    if not isinstance(data, Mapping):
        problems.append(f"{render_path(at)}: must be a table")
        return None
    data = dict(data)
    failed = False
    set_aside: set[str] = set()
    for field in msgspec.structs.fields(model):
        key = field.encode_name
        nested = _nested_model(field.type)
        if key not in data or nested is None:
            continue
        inner, many = nested
        if not many:
            table = validate_into(problems, inner, data[key], (*at, key))
            if table is not None:
                data[key] = table
                continue
        elif isinstance(data[key], list):
            entries = [
                validate_into(problems, inner, entry, (*at, key, index))
                for index, entry in enumerate(data[key])
            ]
            if all(entry is not None for entry in entries):
                data[key] = tuple(entries)
                continue
        else:
            continue  # not an array: msgspec names the wrong type below
        failed = True
        set_aside.add(key)
        del data[key]
    while True:
        try:
            converted = msgspec.convert(data, model, strict=False, dec_hook=dec_hook)
        except msgspec.ValidationError as exc:
            loc, message = _explain(exc, model)
            if "..." in loc:
                loc = _find_key(data, model, loc)
            if set_aside and (not loc or (message == "required" and loc[0] in set_aside)):
                return None  # a consequence of a key set aside, not a mistake of its own
            problems.append(f"{render_path((*at, *loc))}: {message}")
            failed = True
            if not loc or not isinstance(loc[0], str) or loc[0] not in data:
                return None
            set_aside.add(loc[0])
            del data[loc[0]]
        else:
            return None if failed else converted


def _find_key(data: dict[str, Any], model: type[msgspec.Struct], loc: Loc) -> Loc:
    """msgspec says `headers[...]` for a bad value of a table with free keys: find its key."""
    where = loc.index("...")
    table: Any = data
    for part in loc[:where]:
        try:
            table = table[part]
        except (KeyError, IndexError, TypeError):
            table = None
    value_type = _type_at(model, loc[: where + 1])
    if isinstance(table, dict) and value_type is not None:
        for key, value in table.items():
            try:
                msgspec.convert(value, value_type, strict=False, dec_hook=dec_hook)
            except msgspec.ValidationError:
                return (*loc[:where], key, *loc[where + 1 :])
    return (*loc[:where], "*", *loc[where + 1 :])


def render_path(loc: Loc) -> str:
    """`("sinks", 0, "url")` as `sinks[0].url`, the way the file's keys are written."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text or "(top level)"


def _nested_model(annotation: Any) -> tuple[type[msgspec.Struct], bool] | None:
    """The model of a field holding a table (`Model`) or an array of tables
    (`tuple[Model, ...]`), which are validated one by one; None for other fields."""
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return annotation, False
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = args[0]
        if isinstance(item, type) and issubclass(item, msgspec.Struct):
            return item, True
    return None


# -- msgspec's messages in the file's terms ------------------------------------------------------

_AT: Final = re.compile(r"^(?P<message>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_PATH_PART: Final = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_UNKNOWN_KEY: Final = "unknown key"
_KEY_MESSAGES: Final = {
    "Object contains unknown field": _UNKNOWN_KEY,
    "Object missing required field": "required",
}
_BOUND: Final = re.compile(r"^Expected `[^`]+` (?P<op>[<>]=?) (?P<limit>\S+)$")
_LENGTH: Final = re.compile(r"^Expected `(?P<what>[^`]+)` of length (?P<op>[<>]=?) (?P<n>\d+)$")
_TYPE: Final = re.compile(r"^Expected `(?P<expected>[^`]+)`, got `(?P<got>[^`]+)`$")
_NAMES: Final = {
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "bool": "true or false",
    "array": "an array",
    "object": "a table",
    "datetime": "a date-time",
    "date": "a date",
    "time": "a time",
}


def _explain(exc: msgspec.ValidationError, model: type[msgspec.Struct]) -> tuple[Loc, str]:
    """The key path (relative to `model`) and a readable message of a msgspec error."""
    match = _AT.match(str(exc))
    assert match is not None  # the pattern matches any text
    text = match["message"]
    loc: Loc = tuple(
        name if name else (int(index) if index.isdigit() else index)
        for name, index in _PATH_PART.findall(match["path"] or "")
    )
    cause = exc.__cause__
    if isinstance(cause, FieldError):
        return (*loc, cause.key), str(cause)
    if isinstance(cause, (ValueError, TypeError)):
        return loc, str(cause)
    for prefix, message in _KEY_MESSAGES.items():
        if text.startswith(prefix + " `"):
            key = text[len(prefix) + 2 : -1]
            if message == _UNKNOWN_KEY:
                message += _did_you_mean(key, _type_at(model, loc))
            return (*loc, key), message
    if text.startswith("Invalid enum value"):
        return loc, _choices(_type_at(model, loc)) or text
    if bound := _BOUND.match(text):
        return loc, f"must be {bound['op']} {bound['limit'].removesuffix('.0')}"
    if length := _LENGTH.match(text):
        unit = "item" if length["what"] == "array" else "character"
        least = {">=": "at least", "<=": "at most", ">": "more than", "<": "fewer than"}
        n = int(length["n"])
        return loc, f"must have {least[length['op']]} {n} {unit}{'' if n == 1 else 's'}"
    if kind := _TYPE.match(text):
        choices = _choices(_type_at(model, loc))
        if choices:
            return loc, choices
        expected = [_NAMES.get(name, name) for name in kind["expected"].split(" | ")]
        wanted = " or ".join(name for name in expected if name != "null")
        return loc, f"must be {wanted}, not {_NAMES.get(kind['got'], kind['got'])}"
    return loc, text


def _did_you_mean(key: str, table: Any) -> str:
    """`; did you mean 'poll_interval'?` when a key of `table` (a model) is close to `key`."""
    if not (isinstance(table, type) and issubclass(table, msgspec.Struct)):
        return ""
    import difflib  # only for a mistake: 0.2 MiB a running bridge does not need

    names = [f.encode_name for f in msgspec.structs.fields(table)]
    close = difflib.get_close_matches(key, names, n=1) or difflib.get_close_matches(
        key.lower(), names, n=1
    )
    return f"; did you mean {close[0]!r}?" if close else ""


def _type_at(model: type[msgspec.Struct], loc: Loc) -> Any:
    """The annotation of the value at `loc` inside `model` (None when it cannot be told)."""
    annotation: Any = model
    for part in loc:
        annotation = _without_none(annotation)
        if isinstance(part, str) and part != "...":  # "..." is msgspec's "some key of a table"
            if not (isinstance(annotation, type) and issubclass(annotation, msgspec.Struct)):
                return None
            fields = {f.encode_name: f.type for f in msgspec.structs.fields(annotation)}
            annotation = fields.get(part)
        else:
            args = typing.get_args(annotation)
            if not args:
                return None
            annotation = args[1] if typing.get_origin(annotation) is dict else args[0]
    return _without_none(annotation)


def _without_none(annotation: Any) -> Any:
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(args) == 1:
            return _without_none(args[0])
    return annotation


def _choices(annotation: Any) -> str | None:
    """'must be one of ...' for a Literal annotation, else None."""
    if typing.get_origin(annotation) is not Literal:
        return None
    values = [repr(value) for value in typing.get_args(annotation)]
    return f"must be {values[0]}" if len(values) == 1 else f"must be one of {', '.join(values)}"
