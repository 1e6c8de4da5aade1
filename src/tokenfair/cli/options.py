"""Typer commands whose options are one frozen dataclass.

A command's options are declared once, as the fields of a frozen dataclass (``option``: the
default, the help text and, when it is not ``--field-name``, the option's names); a field
made with ``nested`` holds another such dataclass, whose options appear in its place (the
options several commands share are declared once).  :func:`options_command` turns
``f(opts)`` into the function typer registers: its signature lists the fields in order, so
``--help`` shows them as declared, and typer's values arrive as one frozen object.
:func:`options_in_place` does the same for one parameter (or more) of a command whose other
parameters are plain typer ones.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from typing import Any, Callable, TypeVar

import typer

T = TypeVar("T")


def option(default: Any, help: str, *names: str, **checks: Any) -> Any:
    """A dataclass field that is also a typer option (``default`` ``...``: required; ``checks``:
    typer's own, such as ``min=1``)."""
    return dataclasses.field(default=default, metadata={"typer": typer.Option(default, *names, help=help, **checks)})


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


def _check_unique(params: list[inspect.Parameter], where: str) -> list[inspect.Parameter]:
    names = [p.name for p in params]
    if len(set(names)) != len(names):
        raise TypeError(f"{where}: an option is declared twice: {names}")
    return params


def _typer_command(run: Callable[..., None], params: list[inspect.Parameter],
                   call: Callable[[dict[str, Any]], None]) -> Callable[..., None]:
    """What typer registers for ``run``: the signature ``params``; typer's values go to ``call``."""
    @functools.wraps(run)
    def command(**values: Any) -> None:
        call(values)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {}
    del command.__wrapped__              # typer reads the signature above, not run's
    return command


def options_command(cls: type[T]) -> Callable[[Callable[[T], None]], Callable[..., None]]:
    """Decorator: ``run(opts: cls)`` as a typer command with ``cls``'s options (the module docstring)."""
    params = _check_unique(parameters(cls), cls.__name__)

    def wrap(run: Callable[[T], None]) -> Callable[..., None]:
        return _typer_command(run, params, lambda values: run(build(cls, values)))
    return wrap


def options_in_place(run: Callable[..., None]) -> Callable[..., None]:
    """Decorator: a typer command whose parameters typed as an options dataclass (``shaping:
    ShapingOptions = ShapingOptions()``) list that class's options in their place and receive
    them as one frozen object; its other parameters stay as typer reads them."""
    hints = typing.get_type_hints(run)
    groups = {name: cls for name, cls in hints.items() if dataclasses.is_dataclass(cls)}
    plain: list[str] = []
    params: list[inspect.Parameter] = []
    for p in inspect.signature(run).parameters.values():
        if p.name in groups:
            params += parameters(groups[p.name])
        else:
            plain.append(p.name)
            params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints[p.name]))

    def call(values: dict[str, Any]) -> None:
        run(**{name: values[name] for name in plain}, **{name: build(cls, values) for name, cls in groups.items()})
    return _typer_command(run, _check_unique(params, run.__name__), call)
