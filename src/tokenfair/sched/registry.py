"""Policies by name (``--policy``)."""

from __future__ import annotations

from typing import Callable

from .policy import Policy


def _fifo() -> Policy:
    from .fifo import FifoPolicy
    return FifoPolicy()


POLICIES: dict[str, Callable[[], Policy]] = {"fifo": _fifo}


def register(name: str, factory: Callable[[], Policy]) -> None:
    POLICIES[name] = factory


def make_policy(name: str) -> Policy:
    _load_builtin()
    try:
        return POLICIES[name]()
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; choose one of: {', '.join(sorted(POLICIES))}") from None


def policy_names() -> list[str]:
    _load_builtin()
    return sorted(POLICIES)


def _load_builtin() -> None:
    import importlib
    for mod in ("baselines", "fair"):
        try:
            importlib.import_module(f"tokenfair.sched.{mod}")
        except ModuleNotFoundError as err:
            if err.name != f"tokenfair.sched.{mod}":
                raise
