"""Timing engine steps for calibration: a step's shape (``Shape``), a measured step
(``Sample``), and the grid measurement on private copies of a prefilled parent's blocks.

``Shape.features`` is the linear profile's feature vector (``calibrate.COEFFS`` order)::

    [any prefill, sum c, sum c (k + c/2), any decode, n decodes, sum decode contexts, 1]
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from ..core.costmodel import Profile
from .runner import ModelRunner, SeqWork

@dataclass(frozen=True)
class Shape:
    """One step: prefill chunks ``(new, cached)`` and one decode per context in ``decode``."""

    prefill: tuple[tuple[int, int], ...] = ()
    decode: tuple[int, ...] = ()

    @classmethod
    def dec(cls, n: int, ctx: int, block_size: int, spread: bool = False,
            prefill: tuple[tuple[int, int], ...] = ()) -> "Shape":
        """``n`` decodes at context ``ctx``, or (``spread``) spread evenly over [ctx/4, ctx],
        contexts rounded to whole blocks as real batches mixing old and new requests are."""
        if not spread or n == 1:
            return cls(prefill, (ctx,) * n)
        lo = max(block_size, ctx // 4)
        ctxs = np.linspace(lo, ctx, n)
        return cls(prefill, tuple(int(max(block_size, round(c / block_size) * block_size)) for c in ctxs))

    def features(self) -> list[float]:
        return [1.0 if self.prefill else 0.0, float(sum(c for c, _ in self.prefill)),
                float(sum(c * (k + c / 2) for c, k in self.prefill)),
                1.0 if self.decode else 0.0, float(len(self.decode)), float(sum(self.decode)), 1.0]

    def predict(self, profile: Profile) -> float:
        return profile.step_s(list(self.prefill), sum(self.decode), len(self.decode))

    def tokens(self) -> int:
        """KV tokens the step holds (its own copies of the contexts plus the new tokens)."""
        return sum(c + k for c, k in self.prefill) + sum(k + 1 for k in self.decode)

    def max_context(self) -> int:
        return max([k for _, k in self.prefill] + list(self.decode) + [0])

    def label(self) -> str:
        parts = []
        if self.prefill:
            parts.append("prefill " + "+".join(f"{c}@{k}" for c, k in self.prefill))
        if self.decode:
            lo, hi = min(self.decode), max(self.decode)
            parts.append(f"decode {len(self.decode)}x@{lo}" + (f"-{hi}" if hi != lo else ""))
        return ", ".join(parts)


@dataclass
class Sample:
    shape: Shape
    seconds: float                       # median over repeats
    runs: list[float] = field(default_factory=list)


class _Harness:
    """Times steps on sequences whose cached context is a private COPY of one prefilled
    parent's leading blocks: distinct memory per sequence, as in a real batch (sharing the
    blocks would keep them cache-hot and under-measure attention)."""

    def __init__(self, runner: ModelRunner, rng: np.random.Generator, vocab: int) -> None:
        self.runner = runner
        self.rng = rng
        self.vocab = vocab
        self.parent_seq: str | None = None
        self.parent_len = 0
        self.n = 0

    def ids(self, n: int) -> list[int]:
        return self.rng.integers(3, self.vocab, size=n).tolist()

    def prepare(self, max_context: int) -> None:
        """Prefill the parent to ``max_context`` tokens (untimed, once)."""
        if max_context <= self.parent_len:
            return
        seq = self.parent_seq = self.parent_seq or "__parent"
        pos = self.parent_len
        while pos < max_context:
            n = min(512, max_context - pos)
            self.runner.step([SeqWork(seq, self.ids(n), pos, False)])
            pos += n
        self.parent_len = pos

    def child(self, ctx: int) -> str:
        self.n += 1
        seq = f"__c{self.n}"
        if ctx:
            self.prepare(ctx)
            cache = self.runner.cache
            cache.allocate(seq, ctx)
            dst = torch.tensor(cache.block_table(seq))
            src = torch.tensor(cache.block_table(self.parent_seq)[:len(dst)])
            cache.pool[:, :, dst] = cache.pool[:, :, src]
        return seq

    def time_step(self, shape: Shape) -> float:
        batch = [SeqWork(self.child(k), self.ids(c), k, True) for c, k in shape.prefill]
        batch += [SeqWork(self.child(ctx), self.ids(1), ctx, True) for ctx in shape.decode]
        t0 = time.perf_counter()
        self.runner.step(batch)
        dt = time.perf_counter() - t0
        for w in batch:
            self.runner.free(w.seq_id)
        return dt

    def close(self) -> None:
        if self.parent_seq is not None:
            self.runner.free(self.parent_seq)
        self.parent_seq, self.parent_len = None, 0


def measure(runner: ModelRunner, shapes: list[Shape], repeats: int = 5, seed: int = 0,
            progress: Callable[[str], None] | None = None) -> list[Sample]:
    """Median wall time of ``runner.step`` for each shape over ``repeats`` round-robin passes
    (after one warm-up step)."""
    h = _Harness(runner, np.random.default_rng(seed), runner.config.vocab_size)
    try:
        h.prepare(max(s.max_context() for s in shapes))
        h.time_step(Shape(((8, 0),), (h.parent_len,) * 2))
        runs: list[list[float]] = [[] for _ in shapes]
        for r in range(repeats):        # round-robin: a burst of machine noise hits one run per shape
            for i, s in enumerate(shapes):
                runs[i].append(h.time_step(s))
            if progress:
                progress(f"calibrate: pass {r + 1}/{repeats} over {len(shapes)} shapes done")
        return [Sample(s, statistics.median(t), t) for s, t in zip(shapes, runs)]
    finally:
        h.close()


def measure_swap(runner: ModelRunner, tokens: int, repeats: int = 3, seed: int = 0) -> dict:
    """Bytes/s of swap-out + swap-in of one ``tokens``-long sequence (median of both ways)."""
    h = _Harness(runner, np.random.default_rng(seed), runner.config.vocab_size)
    seq = "__swap"
    pos = 0
    while pos < tokens:
        n = min(512, tokens - pos)
        runner.step([SeqWork(seq, h.ids(n), pos, False)])
        pos += n
    rates, nbytes = [], 0
    try:
        for _ in range(repeats):
            out = runner.swap_out(seq)
            back = runner.swap_in(seq)
            nbytes = out.bytes_moved
            rates.append(out.bytes_moved / max(out.seconds, 1e-9))
            rates.append(back.bytes_moved / max(back.seconds, 1e-9))
    finally:
        runner.free(seq)
    return {"tokens": tokens, "bytes": nbytes, "bandwidth": float(statistics.median(rates))}
