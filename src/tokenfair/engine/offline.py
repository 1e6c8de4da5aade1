"""``OfflineGenerator``: a minimal FCFS driver over ``ModelRunner`` for tests and benchmarks.

Per sequence it keeps ``tokens`` (prompt + generated) and ``num_fed`` (tokens whose K/V
are in the cache). Each step feeds every runnable sequence ``tokens[num_fed:]`` capped
by ``prefill_chunk`` and the step's token budget; a sequence samples when the chunk
reaches the end of ``tokens`` -- so decode is just the "one pending token" case and
chunked prefill, recompute and swap all use the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from .runner import ModelRunner, SeqWork, StepOutput
from .sampling import GREEDY, SamplingParams


@dataclass
class SeqState:
    tokens: list[int]
    num_prompt: int
    max_new_tokens: int
    sampling: SamplingParams
    num_fed: int = 0
    swapped: bool = False
    finished: bool = False

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.num_prompt :]


@dataclass
class OfflineGenerator:
    runner: ModelRunner
    prefill_chunk: int = 512
    max_step_tokens: int = 2048
    stop_token_ids: frozenset[int] = frozenset()
    seqs: dict[str, SeqState] = field(default_factory=dict)
    step_outputs: list[StepOutput] = field(default_factory=list)

    def add(self, seq_id: str, prompt: list[int], max_new_tokens: int, sampling: SamplingParams = GREEDY) -> None:
        self.seqs[seq_id] = SeqState(list(prompt), len(prompt), max_new_tokens, sampling)

    def build_batch(self) -> list[SeqWork]:
        budget = self.max_step_tokens
        free_blocks = self.runner.cache.num_free_blocks
        batch: list[SeqWork] = []
        for seq_id, seq in self.seqs.items():
            if seq.finished or seq.swapped or budget == 0:
                continue
            num = min(len(seq.tokens) - seq.num_fed, self.prefill_chunk, budget)
            work = SeqWork(
                seq_id,
                seq.tokens[seq.num_fed : seq.num_fed + num],
                seq.num_fed,
                sample=seq.num_fed + num == len(seq.tokens),
                sampling=seq.sampling,
            )
            needed = self.runner.blocks_needed([work])
            if needed > free_blocks:
                continue
            free_blocks -= needed
            budget -= num
            batch.append(work)
        return batch

    def step(self, batch: list[SeqWork] | None = None) -> StepOutput:
        """Run ``batch`` (default: ``build_batch()``; a caller that needs the batch's shape
        builds it first) and apply its tokens."""
        batch = self.build_batch() if batch is None else batch
        if not batch:
            raise RuntimeError("no runnable sequence fits in the KV cache")
        output = self.runner.step(batch)
        for work in batch:
            seq = self.seqs[work.seq_id]
            seq.num_fed += len(work.token_ids)
            if work.seq_id in output.sampled:
                token = output.sampled[work.seq_id]
                seq.tokens.append(token)
                if len(seq.generated) >= seq.max_new_tokens or token in self.stop_token_ids:
                    seq.finished = True
                    self.runner.free(work.seq_id)
        self.step_outputs.append(output)
        return output

    def has_work(self) -> bool:
        return any(not s.finished for s in self.seqs.values())

    def run(self) -> dict[str, list[int]]:
        while self.has_work():
            self.step()
        return {seq_id: s.generated for seq_id, s in self.seqs.items()}

    # ------------------------------------------------------------ preemption
    def preempt_recompute(self, seq_id: str) -> None:
        self.runner.recompute(seq_id)
        self.seqs[seq_id].num_fed = 0

    def preempt_swap(self, seq_id: str):
        stats = self.runner.swap_out(seq_id)
        self.seqs[seq_id].swapped = True
        return stats

    def resume_swap(self, seq_id: str):
        stats = self.runner.swap_in(seq_id)
        self.seqs[seq_id].swapped = False
        return stats


def generate(
    runner: ModelRunner,
    prompts: Mapping[str, list[int]],
    max_new_tokens: int,
    sampling: SamplingParams = GREEDY,
    prefill_chunk: int = 512,
    max_step_tokens: int = 2048,
    stop_token_ids: Iterable[int] = (),
) -> dict[str, list[int]]:
    """Generate for all ``prompts`` at once; returns the generated ids per sequence."""
    driver = OfflineGenerator(runner, prefill_chunk, max_step_tokens, frozenset(stop_token_ids))
    for seq_id, prompt in prompts.items():
        driver.add(seq_id, prompt, max_new_tokens, sampling)
    return driver.run()
