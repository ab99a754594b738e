"""Spec: the base of every llmplan spec (frozen, no unknown keys, no NaN/inf, values typed as written)."""

from __future__ import annotations

import types
import unicodedata
from functools import cache
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

SPEC_CONFIG = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
"""No use_attribute_docstrings here: the docstring under each spec field documents it in the source, and nothing
reads it from the model (--help takes each flag's help= text in cli/options.py; no JSON schema is written), while
copying it into FieldInfo.description re-read and re-parsed each class's source at import: about 85 ms of the
CLI's ~460 ms import CPU (pydantic 2.14, docs/validation.md#suite-speed). The option groups (specs/options.py) keep
it: tests/test_cli_help.py checks each of their fields has one, and they cost next to nothing."""


def number_kind(annotation: Any) -> type | None:
    """int, float or bool for a field that holds one of them (or None), else None."""
    args = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    kinds = [a for a in args if a is not type(None)]
    return kinds[0] if len(kinds) == 1 and kinds[0] in (int, float, bool) else None


def loose_value(name: str, value: Any, kind: type | None) -> str | None:
    """Why `value` is not written as the `kind` a field holds, or None: a quoted number ("768"), true/false
    for a number, a quoted true/false. Pydantic's lax mode would turn them into numbers (true into 1: a
    one-token window) after any check on the raw mapping, so they are refused with the fix instead."""
    if kind in (int, float) and isinstance(value, bool):
        return f"{name} is {str(value).lower()}, not a number; give {name} as a number or leave it out"
    if kind in (int, float) and isinstance(value, str):
        try:
            number = float(value)
            shown = int(number) if number.is_integer() and abs(number) < 1e18 else number
            fix = f"write it as a plain number, without quotes ({name}: {shown})"
        except (ValueError, OverflowError):
            fix = f"give {name} as a number"
        return f"{name} is the text {value[:40]!r}, not a number; {fix}"
    if kind is bool and isinstance(value, str):
        return f"{name} is the text {value[:40]!r}; write true or false without quotes"
    return None


def printable_name(value: str) -> str:
    """A spec's name as given, refused when it holds a control character (NUL, ESC, DEL, ...): the name is printed
    in every report line and JSON document, and a terminal would act on the character."""
    bad = next((c for c in value if unicodedata.category(c) == "Cc"), None)
    if bad is not None:
        raise ValueError(f"a name may not hold a control character (U+{ord(bad):04X} here): names are printed as "
                         "given; remove it")
    return value


Name = Annotated[str, Field(min_length=1), AfterValidator(printable_name)]
"""A model, GPU or system name: at least one character, no control character (printable_name)."""


class Spec(BaseModel):
    """Base of every spec: frozen, no unknown keys, no NaN/inf, and values typed as written (no quoted
    numbers, no true/false for a number: loose_value), so that every bound applies to the value meant."""

    model_config = SPEC_CONFIG

    @classmethod
    @cache
    def _scalar_fields(cls) -> dict[str, type]:
        kinds = {name: number_kind(f.annotation) for name, f in cls.model_fields.items()}
        return {name: k for name, k in kinds.items() if k is not None}

    @model_validator(mode="before")
    @classmethod
    def _typed_as_written(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, kind in cls._scalar_fields().items():
                problem = loose_value(name, data.get(name), kind)
                if problem:
                    raise ValueError(problem)
        return data
