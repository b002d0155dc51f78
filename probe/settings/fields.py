"""The machinery of a run kind's settings: a field with its meaning, unit, bound and check written once
(:func:`setting`), and the frozen dataclass base (:class:`Settings`) that runs every check when the object is
built, so that a value is checked in one place whichever door it came through (the command line, a Python
call, a JSON request of the live page).

No heavy library: the command line builds these objects before torch is imported.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from .. import bounds
from ..bounds import choice
from ..errors import InputError


class OptionConflict(InputError):
    """Settings that do not go together (two inputs, an option that needs another): the command line
    answers it as a usage error (exit status 2), the library as the :class:`InputError` it is."""


def setting(default: Any = dataclasses.MISSING, *, doc: str, unit: str = "", bound: str = "",
            check: Callable[[Any], Any] | None = None, choices: tuple[str, ...] | None = None,
            option: str | None = None) -> Any:
    """One field of a settings class: its default, what it means (``doc``), its unit and its bound in
    words, and the check that enforces the bound (``check(value)`` raises :class:`InputError` with one
    line, and may return the value normalised: a comma-separated string as a tuple ...).

    Args:
        default: the value when none is given (a list or dict default is given as a tuple or None).
        doc: what the field is, in one sentence.
        unit: tokens, sequences, nats, ... ('' for a switch or a name).
        bound: the values allowed, in words (``>= 1``, ``(0, 1]``, ``one of ...``).
        check: the check run on every value but None (None is "not given" wherever a field allows it).
        choices: the values a field of names may take (checked with ``bounds.choice`` unless ``check`` is given).
        option: the command-line option that sets the field (``--steps``), for messages and the docs.
    """
    metadata = {"doc": doc, "unit": unit, "bound": bound, "check": check, "choices": choices, "option": option}
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


class Settings:
    """Base of the settings classes (each a frozen, keyword-only dataclass): every field's check runs
    once, when the object is built, then :meth:`check_together` for the rules between fields.

    Build from JSON-like values with :meth:`from_mapping` (an unknown name is an :class:`InputError`);
    read back with :meth:`to_json`.
    """

    #: The run kind (``analyze``, ``patch`` ...), as the command and :data:`probe.settings.SETTINGS` name it.
    kind: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.default is dataclasses.MISSING:
                raise InputError(f"{self.kind} needs {f.name}")
            checked = self.check_field(f.name, value)
            if checked is not value:
                object.__setattr__(self, f.name, checked)
        self.check_together()

    @classmethod
    def check_field(cls, name: str, value: Any) -> Any:
        """``value`` of field ``name`` checked (and normalised); None passes where it is not required.

        Raises:
            InputError: the field's one-line message.
        """
        field = _field(cls, name)
        meta = field.metadata
        if value is None:
            return value
        if isinstance(value, list):
            value = tuple(value)
        if meta.get("check") is not None:
            checked = meta["check"](value)
            return value if checked is None else checked
        if meta.get("choices"):
            return choice(meta.get("option") or name, value, meta["choices"])
        return typed(meta.get("option") or name, value, str(field.type).split(" |")[0])

    def check_together(self) -> None:
        """The rules between fields (a subclass's; none here).

        Raises:
            OptionConflict: settings that do not go together; InputError: a combination out of bounds.
        """

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None = None, **more: Any) -> Settings:
        """The settings from a mapping of field names to values (a JSON request, a notebook's dict).

        Raises:
            InputError: a name that is not a field (one line listing the fields), a missing required
                field, or a value out of its bound.
        """
        given = {**dict(values or {}), **more}
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = [k for k in given if k not in names]
        if unknown:
            raise InputError(f"unknown {cls.kind} setting {', '.join(map(repr, unknown))}; settings: "
                             f"{', '.join(names)}")
        missing = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING and f.name not in given]
        if missing:
            raise InputError(f"{cls.kind} needs {', '.join(missing)}")
        return cls(**given)

    @classmethod
    def pick(cls, values: Mapping[str, Any]) -> dict[str, Any]:
        """The items of ``values`` that are fields of ``cls`` (a command's parsed options hold others too)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return {k: v for k, v in values.items() if k in names}

    def to_json(self) -> dict[str, Any]:
        """The settings as JSON values (tuples as lists)."""
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` (checked as a new object is)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def describe(cls) -> list[dict[str, Any]]:
        """One row per field: ``name``, ``option``, ``default``, ``unit``, ``bound``, ``doc`` (the docs' tables)."""
        rows = []
        for f in dataclasses.fields(cls):
            default = None if f.default is dataclasses.MISSING else f.default
            rows.append({"name": f.name, "option": f.metadata.get("option"), "default": _jsonable(default),
                         "required": f.default is dataclasses.MISSING, "unit": f.metadata.get("unit", ""),
                         "bound": f.metadata.get("bound", ""), "doc": f.metadata.get("doc", "")})
        return rows


def _field(cls, name: str) -> dataclasses.Field:
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f
    raise InputError(f"unknown {cls.kind} setting {name!r}")


def typed(name: str, value: Any, annotation: str) -> Any:
    """``value`` of a field without a check of its own, checked against its annotation (``bool``, ``int``,
    ``str``; a path may be given as a ``Path``, kept as a string): a request's JSON gets the same refusal.
    A field's own check that needs the type first calls it too (``probe.settings.kinds``' texts).

    Raises:
        InputError: a value of another type.
    """
    if annotation == "bool" and not isinstance(value, bool):
        raise InputError(f"{name} must be true or false, got {bounds.shown(value)}")
    if annotation == "int" and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
        raise InputError(f"{name} must be an integer, got {bounds.shown(value)}")
    if annotation == "str":
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        if not isinstance(value, str):
            raise InputError(f"{name} must be a string, got {bounds.shown(value)}")
    return value


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def settings_class(cls):
    """The decorator of a settings class: a frozen, keyword-only dataclass."""
    return dataclasses.dataclass(frozen=True, kw_only=True)(cls)
