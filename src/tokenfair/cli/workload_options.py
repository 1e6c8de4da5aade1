"""The options that shape the workload ``simulate`` and ``compare`` read, declared once.

A command decorated with :func:`with_shaping_options` declares one parameter ``shaping:
Shaping = Shaping()``; its ``--help`` lists the options of :data:`SHAPING_OPTIONS` in that place, and it is
called with their values gathered in a :class:`Shaping`.  :func:`resolve_inputs` turns a
workload spec, its shaping, a contract and a profile option into what a simulation runs on.
"""

from __future__ import annotations

import functools
import inspect
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

import typer

from .common import resolve_contract, resolve_workload, shape_workload
from ..contracts.contract import Contract
from ..core.costmodel import Profile, load_profile
from ..workloads.workload import Workload


@dataclass(frozen=True)
class Shaping:
    """The values of :data:`SHAPING_OPTIONS` (each as ``--help`` says); ``Shaping()``: none given."""
    skip_bad_rows: bool = False
    start_s: float | None = None
    end_s: float | None = None
    rate_scale: float | None = None
    spread_tenants: int | None = None
    max_requests: int | None = None
    remap_tenants: Path | None = None


# (the parameter, its type, its option), in ``--help`` order; the names are Shaping's fields
SHAPING_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    ("skip_bad_rows", bool, typer.Option(False, help="count and skip unusable trace rows")),
    ("start_s", Optional[float], typer.Option(None, help="keep arrivals from this time (s)")),
    ("end_s", Optional[float], typer.Option(None, help="keep arrivals before this time (s)")),
    ("rate_scale", Optional[float], typer.Option(None, help="multiply the arrival rate")),
    ("spread_tenants", Optional[int], typer.Option(None, min=1, help="spread requests over N tenants")),
    ("max_requests", Optional[int], typer.Option(None, min=1, help="keep the first N requests")),
    ("remap_tenants", Optional[Path], typer.Option(None, help="YAML/JSON mapping old tenant -> new")),
)

Command = TypeVar("Command", bound=Callable[..., None])


def with_shaping_options(command: Command) -> Command:
    """``command`` as typer sees it: its ``shaping`` parameter replaced by the options."""
    sig = inspect.signature(command)
    hints = typing.get_type_hints(command)
    params: list[inspect.Parameter] = []
    for p in sig.parameters.values():
        if p.name == "shaping":
            params += [inspect.Parameter(name, p.kind, default=option, annotation=kind)
                       for name, kind, option in SHAPING_OPTIONS]
        else:
            params.append(p.replace(annotation=hints[p.name]))

    @functools.wraps(command)
    def run(**options: Any) -> None:
        shaping = Shaping(**{name: options.pop(name) for name, _, _ in SHAPING_OPTIONS})
        command(**options, shaping=shaping)

    run.__signature__ = sig.replace(parameters=params, return_annotation=None)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
    return typing.cast(Command, run)


def resolve_inputs(workload: str, seed: int, shaping: Shaping, contract: Path | None,
                   profile: str | None) -> tuple[Workload, Contract, Profile]:
    """The workload (a scenario, a trace name or file, shaped), the contract (the file, else
    the scenario's, else the default) and the profile; user errors raise."""
    wl, default_contract = resolve_workload(workload, seed, skip_bad_rows=shaping.skip_bad_rows)
    wl = shape_workload(wl, start_s=shaping.start_s, end_s=shaping.end_s, rate_scale=shaping.rate_scale,
                        spread_tenants=shaping.spread_tenants, max_requests=shaping.max_requests, seed=seed,
                        remap_tenants=shaping.remap_tenants)
    return wl, resolve_contract(contract, default_contract), load_profile(profile)
