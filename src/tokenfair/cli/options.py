"""Typer commands whose options are one frozen dataclass.

A command's options are declared once, as the fields of a frozen dataclass (``option``: the
default, the help text and, when it is not ``--field-name``, the option's names); a field
made with ``nested`` holds another such dataclass, whose options appear in its place (the
options several commands share are declared once).  :func:`options_command` turns
``f(opts)`` into the function typer registers: its signature lists the fields in order, so
``--help`` shows them as declared, and typer's values arrive as one frozen object.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from typing import Any, Callable, TypeVar

import typer

T = TypeVar("T")


def option(default: Any, help: str, *names: str) -> Any:
    """A dataclass field that is also a typer option (``default`` ``...``: required)."""
    return dataclasses.field(default=default, metadata={"typer": typer.Option(default, *names, help=help)})


def nested(cls: type) -> Any:
    """A field holding the options dataclass ``cls``; its options are listed in this place."""
    return dataclasses.field(default_factory=cls, metadata={"nested": cls})


def parameters(cls: type) -> list[inspect.Parameter]:
    """The typer parameters of ``cls``'s fields, nested ones expanded, in declaration order."""
    hints = typing.get_type_hints(cls)
    out: list[inspect.Parameter] = []
    for f in dataclasses.fields(cls):
        if "nested" in f.metadata:
            out += parameters(f.metadata["nested"])
        else:
            out.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.metadata["typer"],
                                         annotation=hints[f.name]))
    return out


def build(cls: type[T], values: dict[str, Any]) -> T:
    """``cls`` from typer's ``values`` (one per option, nested dataclasses built in turn)."""
    kw = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        nested_cls = f.metadata.get("nested")
        kw[f.name] = build(nested_cls, values) if nested_cls is not None else values[f.name]
    return cls(**kw)


def options_command(cls: type[T]) -> Callable[[Callable[[T], None]], Callable[..., None]]:
    """Decorator: ``run(opts: cls)`` as a typer command with ``cls``'s options (the module docstring)."""
    names = [p.name for p in parameters(cls)]
    if len(set(names)) != len(names):
        raise TypeError(f"{cls.__name__}: an option is declared twice: {names}")

    def wrap(run: Callable[[T], None]) -> Callable[..., None]:
        @functools.wraps(run)
        def command(**values: Any) -> None:
            run(build(cls, values))

        command.__signature__ = inspect.Signature(parameters(cls))  # type: ignore[attr-defined]
        command.__annotations__ = {}
        del command.__wrapped__              # typer reads the signature above, not run's
        return command
    return wrap
