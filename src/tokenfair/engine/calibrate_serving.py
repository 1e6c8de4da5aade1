"""A short synthetic serving session on the real engine, timed step by step for calibration.

The grid of ``calibrate.py`` times each batch shape on fresh sequences.  A serving engine's
steps are not all like that: decode groups change as requests join and finish, the runner
keeps a steady group's K/V in a decode stage (cheaper steps), rebuilds it when the group
changes (dearer ones) and splits decodes of spread contexts into buckets.  Fitting on the
grid alone left real runs' steps 3-18% slower than predicted on average.  This pass runs
random requests through ``OfflineGenerator`` (FCFS, chunked prefill) with arrivals every
few steps, so the fit also sees steps in the state mix of continuous batching.  The
requests are random (seeded), not any workload the profile is later judged on.
"""

from __future__ import annotations

import numpy as np

from .calibrate_measure import Sample, Shape
from .offline import OfflineGenerator
from .runner import ModelRunner


def measure_serving(runner: ModelRunner, num_steps: int, rng: np.random.Generator, *, max_prompt: int = 1024,
                    max_output: int = 192, mean_concurrency: int = 16, prefill_chunk: int = 512) -> list:
    """``num_steps`` timed steps of a serving session; one ``Sample`` per step.

    Arrivals: a new request whenever fewer than ``mean_concurrency`` run, else with
    probability 1/8 per step (bursts and lulls); prompts log-uniform in [2, ``max_prompt``],
    outputs log-uniform in [8, ``max_output``] (many short, a long tail), both capped by the
    model's positions and the KV pool (a request takes at most an eighth of it).  Stops
    early if nothing fits.  Every sequence it started is freed when it returns."""
    cfg = runner.config
    cache = runner.cache
    pool_tokens = cache.num_blocks * cache.block_size   # a request takes at most 1/8 of the pool
    max_prompt = max(16, min(max_prompt, cfg.max_position // 2, pool_tokens // 8))
    max_output = max(8, min(max_output, cfg.max_position // 2, pool_tokens // 16))
    driver = OfflineGenerator(runner, prefill_chunk=prefill_chunk, max_step_tokens=prefill_chunk + 256)
    samples: list[Sample] = []
    n = 0
    try:
        while len(samples) < num_steps:
            running = sum(not s.finished for s in driver.seqs.values())
            room = cache.num_free_blocks * cache.block_size
            if (running < mean_concurrency or rng.random() < 1 / 8) and room > max_prompt + max_output:
                prompt = _log_uniform(rng, 2, max_prompt)
                output = _log_uniform(rng, 8, max_output)
                n += 1
                driver.add(f"__serve{n}", rng.integers(3, cfg.vocab_size, size=prompt).tolist(), output)
            batch = driver.build_batch()
            if not batch:
                break
            seconds = driver.step(batch).wall_s          # ModelRunner.step's own wall time
            prefill = tuple((len(w.token_ids), w.start_pos) for w in batch if len(w.token_ids) > 1)
            decode = tuple(w.start_pos for w in batch if len(w.token_ids) == 1)
            samples.append(Sample(Shape(prefill, decode), seconds, [seconds]))
    finally:
        for seq_id, seq in driver.seqs.items():
            if not seq.finished:
                runner.free(seq_id)
    return samples


def _log_uniform(rng: np.random.Generator, lo: int, hi: int) -> int:
    """An integer in [lo, hi], log-uniform: chat prompts are mostly short with a long tail."""
    return min(hi, int(np.exp(rng.uniform(np.log(lo), np.log(hi + 1)))))

