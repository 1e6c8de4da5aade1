"""Paged KV-cache accounting as the scheduler sees it (block counts, no tensors).

Invariant: ``num_free + sum(r.blocks for r in holders) == num_blocks`` and every count is
non-negative; a request holds ``ceil(num_computed / block_size)`` blocks while on the device.
Swapped requests hold host blocks instead (``host_used <= host_blocks``).  ``held[tenant]``
is the sum of its requests' device blocks (the fair policy reads it in O(1)).  Every block
change goes through a method here, query and mutation in pairs (``can_grow`` / ``grow``,
``needs_block`` + ``can_add_blocks`` / ``add_block`` / ``add_blocks`` for decodes, whose next
token may cross a block boundary, ``blocks_to_decode`` / ``grow_decodes`` for k decode steps
at once, ``mirror`` for an allocator outside).  Single-request operations are O(1), list ones O(len).
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

    def needs_block(self, req: Request) -> bool:
        """Whether ``req``'s next token fills past the blocks it holds (a decode then takes one)."""
        return req.num_computed >= req.blocks * self.block_size

    def can_add_blocks(self, num: int) -> bool:
        return num <= self.num_free

    def add_block(self, req: Request) -> None:
        """One more block for ``req`` (a decode crossing a block boundary; it holds blocks)."""
        if self.num_free <= 0:
            raise RuntimeError(f"KV pool over-committed for {req.request_id}: no free block")
        self.num_free -= 1
        req.blocks += 1
        self.held[req.tenant] += 1

    def add_blocks(self, reqs: list[Request]) -> None:
        """One more block for each of ``reqs`` (decodes crossing a block boundary)."""
        if len(reqs) > self.num_free:
            raise RuntimeError(f"KV pool over-committed: {len(reqs)} blocks, free {self.num_free}")
        held = self.held
        for r in reqs:
            r.blocks += 1
            held[r.tenant] += 1
        self.num_free -= len(reqs)

    def blocks_to_decode(self, reqs: list[Request], k: int) -> int:
        """Blocks ``k`` more decode steps of ``reqs`` add (growth is monotone in k): O(len)."""
        bs = self.block_size
        total = 0
        for r in reqs:
            g = -(-(r.num_computed + k) // bs) - r.blocks
            if g > 0:
                total += g
        return total

    def grow_decodes(self, reqs: list[Request], k: int) -> int:
        """Grow each of ``reqs`` to hold ``k`` more decode tokens; the blocks added: O(len)."""
        bs = self.block_size
        held = self.held
        grown = 0
        for r in reqs:
            nb = -(-(r.num_computed + k) // bs)
            if nb > r.blocks:
                grown += nb - r.blocks
                held[r.tenant] += nb - r.blocks
                r.blocks = nb
        if grown > self.num_free:
            raise RuntimeError(f"KV pool over-committed: {grown} blocks, free {self.num_free}")
        self.num_free -= grown
        return grown

    def drop_swapped(self, req: Request) -> None:
        """A swapped-out ``req`` ended without coming back: its host blocks are free."""
        self.host_used -= self.blocks_for(req.num_computed)

    def mirror(self, num_free: int, holders: list[tuple[Request, int]]) -> None:
        """Take another allocator's state (vLLM's, in the integration): its free count and
        each holder's blocks; ``held`` is rebuilt in place (the fair policy keeps it)."""
        held: dict[str, int] = {}
        for req, blocks in holders:
            req.blocks = blocks
            held[req.tenant] = held.get(req.tenant, 0) + blocks
        self.num_free = num_free
        self.held.clear()
        self.held.update(held)

    def drop_mirrored(self, req: Request) -> None:
        """The other allocator took ``req``'s blocks back (a preemption there): it holds none;
        the free count comes with the next ``mirror``."""
        self.held[req.tenant] = max(0, self.held.get(req.tenant, 0) - req.blocks)
        req.blocks = 0

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
