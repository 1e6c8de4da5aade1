"""The scheduler's running set: the requests on the device and the KV block pool they hold.

:class:`RunningSet` owns both; the scheduler's other parts (``sched/admit.py``'s
:class:`~tokenfair.sched.admit.Admitter`, ``sched/apply.py``'s
:class:`~tokenfair.sched.apply.Applier`) change them through it and the pool's methods.
"""

from __future__ import annotations

from ..core.kv import BlockPool
from ..core.request import Request, Status


class RunningSet:
    """The running requests, oldest admission first, and the pool their KV blocks come from.

    Invariants (``check``): every request in ``requests`` is RUNNING and appears once; the
    blocks they hold plus ``pool.num_free`` are ``pool.num_blocks``, and ``pool.held`` is
    their per-tenant sum (``kv.BlockPool``).  ``step_stats`` and ``maybe_prefilling`` describe
    the last step built, for the next one (written by the scheduler and fast-forward only).
    """

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.requests: list[Request] = []
        self.step_stats: tuple[int, int, list[Request]] = (0, 0, [])   # last step: decodes, ctx sum, prefills
        # after the last step: the only running requests that may not be decoding (None: unknown)
        self.maybe_prefilling: list[Request] | None = []

    def remove(self, req: Request) -> None:
        """Take a running ``req`` off the device: its slot and its KV blocks are free."""
        self.requests.remove(req)
        self.pool.release(req)

    def release_ended(self, done: list[Request]) -> None:
        """Drop the requests ``done`` just ended from the running set and free their KV:
        O(running)."""
        running = Status.RUNNING        # a local: Python 3.11 does not cache class attributes
        self.requests = [r for r in self.requests if r.status is running]
        for req in done:
            self.pool.release(req)

    def check(self, max_running: int) -> None:
        """Assert the invariants above (tests)."""
        pool, running = self.pool, self.requests
        held = sum(r.blocks for r in running)
        assert held + pool.num_free == pool.num_blocks, (held, pool.num_free)
        per_tenant: dict[str, int] = {}
        for r in running:
            per_tenant[r.tenant] = per_tenant.get(r.tenant, 0) + r.blocks
        assert {t: b for t, b in pool.held.items() if b} == {t: b for t, b in per_tenant.items() if b}
        assert all(r.status is Status.RUNNING for r in running)
        assert len({id(r) for r in running}) == len(running)
        assert len(running) <= max_running
