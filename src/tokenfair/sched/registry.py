"""Policies by name (``--policy``)."""

from __future__ import annotations

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
    try:
        return factory(**kwargs)
    except (TypeError, ValueError) as err:       # unknown option, or a value it cannot take
        raise ValueError(f"policy {spec!r}: bad option ({err})") from None


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
