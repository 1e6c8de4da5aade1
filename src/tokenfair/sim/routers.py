"""Routers: which replica takes a request, from what a real router sees of each replica.

A router reads a :class:`ReplicaView` per replica -- queue depth (requests waiting in the
replica's scheduler), running count, KV use, and its prefix cache (``peek``: how many leading
prefix blocks of the request it holds) -- never the true output lengths.  Every choice is
deterministic: ties go to the lowest replica index (each key below ends in the index).

  ``round-robin``   replicas in turn;
  ``least-loaded``  fewest requests in the replica (waiting + running + released by the
                    gateway but not yet arrived);
  ``kv-aware``      lowest KV use, then least loaded;
  ``prefix-aware``  the longest cached prefix among replicas whose load is within
                    ``load_bound`` x (the least load + 1) -- locality without letting one
                    hot prefix pile onto a few replicas while others idle; then least loaded;
  ``locality``      the longest cached prefix with no load bound (DLPM-style placement,
                    D²LPM's first criterion), then least loaded.
"""

from __future__ import annotations

from typing import Protocol, Sequence

ROUTERS = ("round-robin", "least-loaded", "kv-aware", "prefix-aware", "locality")
DEFAULT_LOAD_BOUND = 1.5


class ReplicaView(Protocol):
    index: int

    def load(self) -> int: ...                  # requests in the replica
    def kv_usage(self) -> float: ...            # fraction of its KV blocks held
    def cached_prefix(self, hashes: Sequence[int]) -> int: ...   # leading blocks it holds


class Router:
    name = "base"
    reads_state = True          # False: the choice never depends on the replicas' state

    def choose(self, replicas: Sequence[ReplicaView], hashes: Sequence[int]) -> int:
        raise NotImplementedError


class RoundRobin(Router):
    name = "round-robin"
    reads_state = False

    def __init__(self) -> None:
        self._next = 0

    def choose(self, replicas: Sequence[ReplicaView], hashes: Sequence[int]) -> int:
        i = self._next % len(replicas)
        self._next = i + 1
        return replicas[i].index


class LeastLoaded(Router):
    name = "least-loaded"

    def choose(self, replicas: Sequence[ReplicaView], hashes: Sequence[int]) -> int:
        return min(replicas, key=lambda r: (r.load(), r.index)).index


class KvAware(Router):
    name = "kv-aware"

    def choose(self, replicas: Sequence[ReplicaView], hashes: Sequence[int]) -> int:
        return min(replicas, key=lambda r: (r.kv_usage(), r.load(), r.index)).index


class PrefixAware(Router):
    """Longest cached prefix within a load bound (``load_bound`` None: no bound)."""
    name = "prefix-aware"

    def __init__(self, load_bound: float | None = DEFAULT_LOAD_BOUND) -> None:
        if load_bound is not None and load_bound < 1.0:
            raise ValueError(f"prefix-aware router: load_bound must be >= 1, got {load_bound}")
        self.load_bound = load_bound

    def choose(self, replicas: Sequence[ReplicaView], hashes: Sequence[int]) -> int:
        loads = [r.load() for r in replicas]
        pool = list(range(len(replicas)))
        if self.load_bound is not None:
            limit = self.load_bound * (min(loads) + 1.0)
            pool = [j for j in pool if loads[j] <= limit] or pool
        if not hashes:
            return replicas[min(pool, key=lambda j: (loads[j], replicas[j].index))].index
        best = min(pool, key=lambda j: (-replicas[j].cached_prefix(hashes), loads[j], replicas[j].index))
        return replicas[best].index


def make_router(name: str, load_bound: float | None = DEFAULT_LOAD_BOUND) -> Router:
    if name == "round-robin":
        return RoundRobin()
    if name == "least-loaded":
        return LeastLoaded()
    if name == "kv-aware":
        return KvAware()
    if name == "prefix-aware":
        return PrefixAware(load_bound)
    if name == "locality":
        r = PrefixAware(None)
        r.name = "locality"
        return r
    raise ValueError(f"unknown router {name!r}; choose one of {', '.join(ROUTERS)}")
