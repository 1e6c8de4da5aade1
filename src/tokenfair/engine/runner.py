"""``ModelRunner``: one forward pass per scheduler step over a mixed prefill/decode batch.

Contract of ``step(batch)``:
  * each ``SeqWork`` feeds ``token_ids`` at positions ``start_pos ..``; ``start_pos`` must
    equal the number of tokens the KV cache already holds for that sequence (so a
    sequence is fed exactly once per position, in order, and resumes after swap-in);
  * every item's KV blocks are checked to fit BEFORE anything is allocated; if they do
    not, ``CacheFullError`` is raised and the runner is unchanged;
  * items with ``sample=True`` get exactly one sampled token in ``StepOutput.sampled``.
The scheduler owns policy (which items, preemption choice); the runner only executes.

A decode group that decodes the same sequences two steps running gets a ``DecodeStage``
(``attention.py``): its K/V kept contiguous, appended to each step instead of gathered from
the blocks in every layer.  Results are bit-identical either way (``stage_decode=False``
turns it off); the stage is dropped when a member is freed, recomputed or swapped out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch

from ..core.reasons import Reason, ReasonCode
from .attention import AttentionGroup, AttentionMetadata, DecodeStage, build_attention_group
from .buckets import decode_buckets, prefill_buckets
from .kv_cache import CacheFullError, PagedKVCache, TransferStats
from .loader import LoadedModel, build_model
from .model import LlamaDecoder
from .sampling import GREEDY, SamplingParams, make_generator, sample_tokens
from .stages import DecodeStages


@dataclass(frozen=True)
class SeqWork:
    seq_id: str
    token_ids: list[int]
    start_pos: int
    sample: bool
    sampling: SamplingParams = GREEDY


@dataclass(frozen=True)
class StepOutput:
    sampled: dict[str, int]
    wall_s: float
    num_tokens: int
    num_seqs: int
    logits: torch.Tensor | None = field(default=None, repr=False)  # [num sampled, vocab]
    # seq_id -> reason: sampled items that got no token because of their own fault (NaN
    # logits, a seed the generator refuses); their KV for this step is written
    failed: dict[str, Reason] = field(default_factory=dict)


class ModelRunner:
    def __init__(
        self,
        model: LlamaDecoder,
        num_blocks: int,
        block_size: int = 16,
        num_host_blocks: int | None = None,
        num_threads: int = 2,
        seed: int = 0,
        keep_logits: bool = False,
        optimize: bool = True,
        stage_decode: bool = True,
    ) -> None:
        if num_threads <= 0:
            raise ValueError(f"num_threads must be positive, got {num_threads}")
        torch.set_num_threads(num_threads)  # process-wide; the runner owns the CPU budget
        if optimize:
            model.optimize_for_inference()  # fused, GEMM-friendly weights (same math)
        self.model = model
        self.config = model.config
        parameter = next(model.parameters())
        self.device = parameter.device
        self.cache = PagedKVCache(
            num_layers=self.config.num_layers,
            num_kv_heads=self.config.num_kv_heads,
            head_dim=self.config.head_dim,
            num_blocks=num_blocks,
            block_size=block_size,
            num_host_blocks=num_host_blocks,
            dtype=parameter.dtype,
            device=self.device,
        )
        self.keep_logits = keep_logits
        self.stage_decode = stage_decode  # keep decode groups' K/V contiguous across steps
        self.stages = DecodeStages(self.config.num_layers, block_size)
        self._seed_source = make_generator(seed)
        self._generators: dict[str, torch.Generator] = {}

    @classmethod
    def from_loaded(
        cls, loaded: LoadedModel, num_blocks: int, dtype: torch.dtype = torch.float32, **kwargs
    ) -> "ModelRunner":
        return cls(build_model(loaded, dtype), num_blocks, **kwargs)

    # -------------------------------------------------------------- admission
    def blocks_needed(self, batch: list[SeqWork]) -> int:
        return sum(self.cache.blocks_needed(w.seq_id, len(w.token_ids)) for w in batch)

    def can_step(self, batch: list[SeqWork]) -> bool:
        """Whether ``step(batch)`` fits in the free KV blocks (pure query)."""
        return all(not self.cache.is_swapped(w.seq_id) for w in batch) and (
            self.blocks_needed(batch) <= self.cache.num_free_blocks
        )

    def _validate(self, batch: list[SeqWork]) -> None:
        seq_ids = [w.seq_id for w in batch]
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError("a sequence may appear at most once per step")
        for work in batch:
            if not work.token_ids:
                raise ValueError(f"{work.seq_id}: empty token_ids")
            if self.cache.is_swapped(work.seq_id):
                raise ValueError(f"{work.seq_id}: swapped out; swap_in before stepping it")
            if work.start_pos != self.cache.num_tokens(work.seq_id):
                raise ValueError(
                    f"{work.seq_id}: start_pos {work.start_pos} != cached tokens "
                    f"{self.cache.num_tokens(work.seq_id)}"
                )
            if work.start_pos + len(work.token_ids) > self.config.max_position:
                raise ValueError(f"{work.seq_id}: exceeds max_position {self.config.max_position}")
        if not self.can_step(batch):
            raise CacheFullError(f"batch needs {self.blocks_needed(batch)} blocks, {self.cache.num_free_blocks} free")

    # ------------------------------------------------------------------- step
    def step(self, batch: list[SeqWork]) -> StepOutput:
        started = time.perf_counter()
        if not batch:
            return StepOutput({}, 0.0, 0, 0)
        self._validate(batch)
        # Single-token items first, by ascending context (so decode buckets are contiguous
        # row ranges), then the prefill chunks in the caller's order.  Outputs are keyed by
        # seq_id; kept logits are put back in the caller's order below.
        work_order = sorted(batch, key=lambda w: (0, w.start_pos) if len(w.token_ids) == 1 else (1, 0))
        for work in work_order:
            self.cache.allocate(work.seq_id, len(work.token_ids))
        token_ids, positions, metadata, logits_indices = self._prepare(work_order)
        try:
            logits = self.model(token_ids, positions, self.cache.pool, metadata, logits_indices)
        except BaseException:
            self.stages.clear()  # a half-written stage must not be appended to
            raise
        sampling_items = [w for w in work_order if w.sample]
        failed = self._non_finite_rows(logits, sampling_items)
        if failed:  # sample the other rows; the failed rows' tokens are dropped below
            logits = torch.nan_to_num(logits, nan=0.0, posinf=0.0, neginf=0.0)
        if all(w.sampling.is_greedy for w in sampling_items):
            # max().indices: the first maximal index like argmax, ~3x faster on CPU
            tokens = logits.max(dim=-1).indices.tolist() if sampling_items else []
        else:
            params, generators = self._samplers(sampling_items, failed)
            tokens = sample_tokens(logits, params, generators)
        sampled = {w.seq_id: t for w, t in zip(sampling_items, tokens) if w.seq_id not in failed}
        if self.keep_logits and work_order != batch:
            row = {w.seq_id: i for i, w in enumerate(sampling_items)}
            logits = logits[torch.tensor([row[w.seq_id] for w in batch if w.sample], dtype=torch.long)]
        wall_s = time.perf_counter() - started
        return StepOutput(sampled, wall_s, int(token_ids.shape[0]), len(batch), logits if self.keep_logits else None,
                          failed)

    @staticmethod
    def _non_finite_rows(logits: torch.Tensor, items: list[SeqWork]) -> dict[str, Reason]:
        """The sampled sequences whose logits row holds a NaN or an infinity (their token
        would be garbage): one reduction over the step's logits."""
        if not items:
            return {}
        finite = torch.isfinite(logits).all(dim=-1)
        if bool(finite.all()):
            return {}
        why = Reason(ReasonCode.NON_FINITE_LOGITS, "the model produced NaN/inf logits for this request")
        return {items[i].seq_id: why for i in (~finite).nonzero().flatten().tolist()}

    def _samplers(self, items: list[SeqWork], failed: dict[str, Reason]):
        """Per sampled row its params and generator; a row whose generator cannot be made (a
        seed the generator refuses) is failed in ``failed`` and sampled greedily."""
        params: list[SamplingParams] = []
        generators: list[torch.Generator | None] = []
        for w in items:
            try:
                generator = None if w.seq_id in failed else self._generator_for(w)
            except (ValueError, RuntimeError, OverflowError, TypeError) as err:
                failed[w.seq_id] = Reason(ReasonCode.INVALID_SAMPLING, f"{type(err).__name__}: {err}")
                generator = None
            greedy = w.seq_id in failed
            params.append(GREEDY if greedy else w.sampling)
            generators.append(None if greedy else generator)
        return params, generators

    def _prepare(self, batch: list[SeqWork]):
        """Build every index tensor of the step at once (no per-token Python loops)."""
        block_size = self.cache.block_size
        device = self.device
        flat_ids = [t for w in batch for t in w.token_ids]
        query_lens = torch.tensor([len(w.token_ids) for w in batch])
        start_pos = torch.tensor([w.start_pos for w in batch])
        context_lens = start_pos + query_lens
        query_starts = torch.zeros(len(batch), dtype=torch.long)
        query_starts[1:] = query_lens.cumsum(0)[:-1]
        tables = [self.cache.block_table(w.seq_id) for w in batch]
        max_blocks = max(len(t) for t in tables)
        block_tables = torch.tensor([t + [0] * (max_blocks - len(t)) for t in tables])
        seq_of_token = torch.repeat_interleave(torch.arange(len(batch)), query_lens)
        positions = start_pos[seq_of_token] + torch.arange(len(flat_ids)) - query_starts[seq_of_token]
        slot_mapping = block_tables[seq_of_token, positions // block_size] * block_size + positions % block_size
        is_decode = query_lens == 1
        groups: list[AttentionGroup] = []
        stages: dict[tuple[str, ...], DecodeStage] = {}
        unstaged: dict[tuple[str, ...], tuple[torch.Tensor, int]] = {}
        for members in (*decode_buckets(context_lens, is_decode, block_size),
                        *prefill_buckets(query_lens, context_lens, is_decode)):
            if members.numel() == 0:
                continue
            group_blocks = int(((context_lens[members] + block_size - 1) // block_size).max())
            group = build_attention_group(
                block_tables[members, :group_blocks],
                context_lens[members],
                query_starts[members],
                query_lens[members],
                block_size,
            )
            if self.stage_decode and bool(is_decode[members[0]]):
                seq_ids = tuple(batch[i].seq_id for i in members.tolist())
                plan = self.stages.plan(seq_ids, context_lens[members], self.cache.pool, stages, unstaged)
                group = replace(group, stage=plan)
            groups.append(group.to(device))
        self.stages.replace(stages, unstaged)
        sample_rows = torch.tensor([i for i, w in enumerate(batch) if w.sample], dtype=torch.long)
        logits_indices = (query_starts + query_lens - 1)[sample_rows]
        metadata = AttentionMetadata(slot_mapping.to(device), tuple(groups), len(flat_ids))
        return (
            torch.tensor(flat_ids, device=device),
            positions.to(device),
            metadata,
            logits_indices.to(device),
        )

    def _generator_for(self, work: SeqWork) -> torch.Generator | None:
        if work.sampling.is_greedy:
            return None
        generator = self._generators.get(work.seq_id)
        if generator is None:
            seed = work.sampling.seed
            if seed is None:
                seed = int(torch.randint(0, 2**62, (1,), generator=self._seed_source))
            generator = self._generators[work.seq_id] = make_generator(seed)
        return generator

    # ------------------------------------------------------------- lifecycle
    def free(self, seq_id: str) -> None:
        """The sequence is finished: drop its KV blocks (both pools) and sampler state."""
        self.cache.free(seq_id)
        self._generators.pop(seq_id, None)
        self.stages.drop(seq_id)

    def recompute(self, seq_id: str) -> int:
        """Preempt by recomputation: drop KV blocks but keep the sampler state.

        Returns the number of tokens dropped; the caller re-feeds the prompt plus ALL
        generated tokens as prefill from position 0 (chunked as it likes), with
        ``sample=True`` on the final chunk, which yields the next new token.
        """
        dropped = self.cache.num_tokens(seq_id)
        self.cache.free(seq_id)
        self.stages.drop(seq_id)
        return dropped

    def rollback(self, num_tokens_before: dict[str, int | None]) -> None:
        """Undo a step that raised: each sequence's device KV back to what it held before
        (``None``: nothing), every decode stage dropped (it may be half appended); sampler
        state is kept."""
        for seq_id, num in num_tokens_before.items():
            self.cache.truncate(seq_id, num)
        self.stages.clear()

    def swap_out(self, seq_id: str) -> TransferStats:
        self.stages.drop(seq_id)
        return self.cache.swap_out(seq_id)

    def swap_in(self, seq_id: str) -> TransferStats:
        return self.cache.swap_in(seq_id)
