"""Paged KV-cache accounting as the scheduler sees it (block counts, no tensors).

Invariant: ``num_free + sum(r.blocks for r in holders) == num_blocks`` and every count is
non-negative; a request holds ``ceil(num_computed / block_size)`` blocks while on the device.
Swapped requests hold host blocks instead (``host_used <= host_blocks``).  ``held[tenant]``
is the sum of its requests' device blocks (the fair policy reads it in O(1)); code that grows
``req.blocks`` directly (the scheduler's decode path, the simulator's fast-forward) keeps it
too.  Query and mutation come in pairs (``can_grow`` / ``grow``).  All operations are O(1).
"""

from __future__ import annotations

from .request import Request


class BlockPool:
    __slots__ = ("num_blocks", "block_size", "num_free", "host_blocks", "host_used", "held")

    def __init__(self, num_blocks: int, block_size: int, host_blocks: int = 0) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_free = num_blocks
        self.host_blocks = host_blocks
        self.host_used = 0
        self.held: dict[str, int] = {}       # tenant -> device blocks of its requests

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def extra_blocks(self, req: Request, new_tokens: int) -> int:
        """Blocks ``req`` needs beyond what it holds to compute ``new_tokens`` more tokens."""
        return max(0, self.blocks_for(req.num_computed + new_tokens) - req.blocks)

    def can_grow(self, req: Request, new_tokens: int) -> bool:
        return self.extra_blocks(req, new_tokens) <= self.num_free

    def grow(self, req: Request, new_tokens: int) -> None:
        need = self.extra_blocks(req, new_tokens)
        if need > self.num_free:
            raise RuntimeError(f"KV pool over-committed for {req.request_id}: need {need}, free {self.num_free}")
        self.num_free -= need
        req.blocks += need
        self.held[req.tenant] = self.held.get(req.tenant, 0) + need

    def release(self, req: Request) -> int:
        freed = req.blocks
        self.num_free += freed
        req.blocks = 0
        if freed:
            self.held[req.tenant] -= freed
        return freed

    def can_swap_out(self, req: Request) -> bool:
        return self.host_used + self.blocks_for(req.num_computed) <= self.host_blocks

    def swap_out(self, req: Request) -> int:
        """Move ``req``'s blocks to host memory; returns the number of blocks moved."""
        moved = self.blocks_for(req.num_computed)   # blocks grown for an unrun chunk are just freed
        self.host_used += moved
        self.release(req)
        return moved

    def can_swap_in(self, req: Request) -> bool:
        return self.blocks_for(req.num_computed) <= self.num_free

    def swap_in(self, req: Request) -> int:
        need = self.blocks_for(req.num_computed)
        if need > self.num_free:
            raise RuntimeError(f"cannot swap in {req.request_id}: need {need}, free {self.num_free}")
        self.host_used -= need
        self.num_free -= need
        req.blocks = need
        self.held[req.tenant] = self.held.get(req.tenant, 0) + need
        return need

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free / self.num_blocks
