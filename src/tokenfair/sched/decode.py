"""The decode path's token advance, one home for stepping and fast-forward alike.

A decoding request computes one token per step, and every token it computes is sampled.
Its KV blocks grow through :class:`~tokenfair.core.kv.BlockPool` (``needs_block`` /
``add_block`` / ``add_blocks`` when a step is built, ``grow_decodes`` for k steps at once);
its tokens advance here: ``IterationScheduler.update_from_output`` (through the applier,
``sched/apply.py``) calls :func:`advance_decodes` with ``k = 1`` for the step's decodes, the
simulator's fast-forward (``sim/fastforward.py``) with the ``k`` steps of a segment.
"""

from __future__ import annotations

from ..core.request import Request


def advance_decodes(reqs: list[Request], k: int, now: float) -> list[Request]:
    """Each of ``reqs`` (RUNNING, decoding, its blocks already grown) computes and samples
    ``k`` more tokens; a first token is stamped ``now``.  Returns those at ``max_tokens``
    now, in order.  O(len(reqs))."""
    reached_max: list[Request] = []
    for req in reqs:                        # hot loop: O(1) per decoding request
        req.num_computed += k
        num_output = req.num_output + k
        req.num_output = num_output
        if req.first_token_s is None:
            req.first_token_s = now
        if num_output >= req.max_tokens:
            reached_max.append(req)
    return reached_max
