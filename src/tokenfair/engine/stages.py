"""The decode stages a runner keeps between steps (``attention.DecodeStage``): a decode group
that decodes the same sequences ``STAGE_AFTER`` steps running gets its K/V kept contiguous and
appended to, instead of gathered from the blocks in every layer (results bit-identical).

Invariant: ``live`` holds at most one stage per group of sequence ids, and a stage's
sequences all still hold their KV on the device -- a member freed, recomputed or swapped out
drops every stage it is in (``drop``); a step that raised drops them all (``clear``).  The
buffers of dropped stages go to ``spares`` for reuse."""

from __future__ import annotations

import torch

from .attention import DecodeStage, StageBuffers, StagePlan

STAGE_HEADROOM = 32  # tokens a decode stage can grow by before it is rebuilt
STAGE_AFTER = 3      # steady steps a decode group must have run before it gets a stage

GroupIds = tuple[str, ...]


class DecodeStages:
    def __init__(self, num_layers: int, block_size: int) -> None:
        self.block_size = block_size
        self.live: dict[GroupIds, DecodeStage] = {}
        self.spares = StageBuffers(2 * num_layers)  # buffers of dropped stages
        self.unstaged: dict[GroupIds, tuple[torch.Tensor, int]] = {}  # other groups: contexts, run

    def plan(self, seq_ids: GroupIds, contexts: torch.Tensor, pool: torch.Tensor,
             stages: dict[GroupIds, DecodeStage],
             unstaged: dict[GroupIds, tuple[torch.Tensor, int]]) -> StagePlan | None:
        """Append to the decode group's stage from the last step; start one when the group
        has decoded exactly these sequences for ``STAGE_AFTER`` steps (building a stage costs
        about a third of a step, so it pays off only over a long run of steady steps; groups
        in serving often last a few steps); else ``None`` (gather the blocks).  The step's
        stages and unstaged groups are collected in ``stages`` / ``unstaged`` (``replace``)."""
        stage = self.live.get(seq_ids)
        refill = stage is None or not stage.can_append(contexts)
        if refill and stage is None:
            previous, run = self.unstaged.get(seq_ids, (None, 0))
            run = run + 1 if previous is not None and torch.equal(previous + 1, contexts) else 1
            if run < STAGE_AFTER:
                unstaged[seq_ids] = (contexts, run)
                return None
        if refill:
            capacity = -(-(int(contexts.max()) + STAGE_HEADROOM) // self.block_size) * self.block_size
            stage = DecodeStage(seq_ids, pool, capacity, self.spares)
        stage.lens = contexts.clone()
        stages[seq_ids] = stage
        return StagePlan(stage, refill, stage.append_slots(contexts))

    def replace(self, stages: dict[GroupIds, DecodeStage],
                unstaged: dict[GroupIds, tuple[torch.Tensor, int]]) -> None:
        """Replace the live stages; the buffers of those dropped go to the spares."""
        kept = {id(st) for st in stages.values()}
        for stage in self.live.values():
            if id(stage) not in kept:
                stage.release(self.spares)
        self.live, self.unstaged = stages, unstaged

    def drop(self, seq_id: str) -> None:
        """Every stage ``seq_id`` is in (its KV is going away)."""
        self.replace({ids: st for ids, st in self.live.items() if seq_id not in ids},
                     {ids: c for ids, c in self.unstaged.items() if seq_id not in ids})

    def clear(self) -> None:
        self.replace({}, {})
