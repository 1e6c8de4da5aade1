"""Policies by name (``--policy``)."""

from __future__ import annotations

import inspect
import math
from typing import Callable

from .policy import Policy


def _fifo() -> Policy:
    from .baselines.fifo import FifoPolicy
    return FifoPolicy()


POLICIES: dict[str, Callable[[], Policy]] = {"fifo": _fifo}

# what ``tokenfair compare`` and ``tokenfair demo`` run by default, in their tables' order
DEFAULT_POLICIES = ("fifo", "sjf", "priority", "vtc", "fair")


def register(name: str, factory: Callable[[], Policy]) -> None:
    POLICIES[name] = factory


def make_policy(spec: str) -> Policy:
    """``name`` or ``name:key=value,key=value`` (options go to the policy's constructor)."""
    _load_builtin()
    name, _, opts = spec.partition(":")
    kwargs = {}
    for item in filter(None, opts.split(",")):
        k, eq, v = item.partition("=")
        if not eq:
            raise ValueError(f"policy {spec!r}: option {item!r} must look like key=value")
        kwargs[k.strip()] = v.strip()
    try:
        factory = POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; choose one of: {', '.join(sorted(POLICIES))}") from None
    options = policy_options(factory)
    unknown = sorted(set(kwargs) - set(options)) if options is not None else []
    if unknown:
        takes = ", ".join(options or ()) or "no options"
        raise ValueError(f"policy {spec!r}: unknown option {unknown[0]!r}; {name} takes: {takes}")
    try:
        return factory(**kwargs)
    except (TypeError, ValueError) as err:       # a value it cannot take
        raise ValueError(f"policy {spec!r}: bad option ({err})") from None


def policy_options(factory: Callable[..., Policy]) -> list[str] | None:
    """The option names a policy's factory takes (its keyword parameters); None when it takes
    any (``**kwargs``) or has no signature to read: the call decides."""
    try:
        params = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def number_option(policy: str, name: str, raw: float | str, minimum: float) -> float:
    """A policy option's value (a string from a spec, or a number) as a finite float of at
    least ``minimum``; otherwise a ValueError naming the option and what it takes."""
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value >= minimum):
        raise ValueError(f"{policy}: {name} must be a finite number >= {minimum:g}, got {raw!r}")
    return value


def policy_names() -> list[str]:
    _load_builtin()
    return sorted(POLICIES)


def _load_builtin() -> None:
    import importlib
    for mod in ("baselines.classic", "baselines.vtc", "fair"):
        try:
            importlib.import_module(f"tokenfair.sched.{mod}")
        except ModuleNotFoundError as err:
            if err.name != f"tokenfair.sched.{mod}":
                raise
