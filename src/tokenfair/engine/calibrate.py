"""Calibrate the simulator's LINEAR step-time profile against the real engine on this machine.

Measure ``ModelRunner.step`` over a grid of batch shapes -- prefill chunks of ``c`` new
tokens over ``k`` cached ones, decode batches of ``b`` sequences at contexts ``ctx_i``, and
mixed steps (needed to tell the per-step constants apart) -- then fit, by non-negative
least squares on RELATIVE error (numpy only)::

    step_s = prefill_batch_s [if prefill] + prefill_token_s * sum c + prefill_attn_s * sum c (k + c/2)
           + decode_base_s [if decode] + decode_seq_s * b + decode_ctx_s * sum ctx_i + overhead_s

Cached context is a private copy of the leading blocks of one prefilled "parent" sequence
(distinct memory per sequence, as in a real batch); decode batches include contexts spread
over [ctx/4, ctx], since the engine pads a decode batch to its longest context.  The swap
bandwidth is measured by swapping a long sequence out and back in.  The result is a profile
YAML that ``tokenfair.costmodel.load_profile`` reads, with the engine's KV geometry.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import yaml

from ..costmodel import Profile
from .real import DEFAULT_BLOCK_SIZE, DEFAULT_KV_TOKENS, default_cpu_profile, load_model, model_name, real_profile
from .calibrate_serving import measure_serving
from .runner import ModelRunner, SeqWork

COEFFS = ("prefill_batch_s", "prefill_token_s", "prefill_attn_s", "decode_base_s", "decode_seq_s", "decode_ctx_s",
          "overhead_s")


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


@dataclass
class Calibration:
    profile: Profile
    samples: list[Sample]
    predicted: list[float]
    fit: dict                             # mape, median_ape, max_ape, r2
    swap: dict
    seconds: float
    serving: dict = field(default_factory=dict)   # the serving pass: steps, median_ape, bias

    def table(self) -> str:
        lines = [f"{'shape':<44}{'measured ms':>12}{'fitted ms':>11}{'error':>8}"]
        for s, p in zip(self.samples, self.predicted):
            lines.append(f"{s.shape.label()[:43]:<44}{s.seconds * 1e3:>12.2f}{p * 1e3:>11.2f}"
                         f"{(p - s.seconds) / s.seconds:>8.0%}")
        f = self.fit
        lines.append(f"fit: mean |err| {f['mape']:.1%}, median {f['median_ape']:.1%}, max {f['max_ape']:.1%}, "
                     f"R^2 {f['r2']:.3f} over {len(self.samples)} shapes; swap {self.swap['bandwidth'] / 1e9:.2f} GB/s; "
                     f"{self.seconds:.0f}s")
        if self.serving.get("steps"):
            v = self.serving
            lines.append(f"serving pass: {v['steps']} steps of random requests, fitted with the grid at equal total "
                         f"weight: median |err| {v['median_ape']:.1%}, measured/predicted {v['bias']:.2f}")
        lines.append("coefficients: " + ", ".join(f"{k}={getattr(self.profile, k):.3g}" for k in COEFFS))
        return "\n".join(lines)


def default_grid(quick: bool = False, block_size: int = DEFAULT_BLOCK_SIZE) -> list[Shape]:
    """The measured shapes.  ``quick``: a handful of small shapes (tests, tiny models).
    The default grid stays within 16,384 KV tokens per step (the default engine pool)."""
    b = block_size
    d = Shape.dec
    if quick:
        shapes = [Shape(((c, k),)) for c in (4, 16, 40) for k in (0, 4 * b)]
        shapes += [d(n, ctx, b) for n in (1, 4, 12) for ctx in (2 * b, 8 * b)]
        shapes += [d(8, 8 * b, b, spread=True), d(4, 4 * b, b, prefill=((16, 0),)),
                   d(8, 2 * b, b, prefill=((4, 0), (8, 2 * b)))]
        return shapes
    shapes = [Shape(((c, k),)) for c in (16, 64, 256, 512) for k in (0, 32 * b)]
    shapes += [Shape(((c, 64 * b),)) for c in (64, 256)]   # long cached context: prefill_attn_s
    shapes += [Shape(((128, 0),) * 4), Shape(((32, 8 * b),) * 8)]
    # decode batches: mostly contexts spread over [ctx/4, ctx], as in serving (the runner then
    # attends in two or three context buckets, each a separate attention call per layer)
    shapes += [d(n, ctx, b) for n, ctx in ((1, 8 * b), (1, 64 * b), (16, 8 * b), (32, 16 * b), (64, 8 * b))]
    shapes += [d(n, ctx, b, spread=True) for n, ctx in ((4, 8 * b), (4, 64 * b), (16, 32 * b), (32, 8 * b),
                                                        (8, 64 * b), (16, 64 * b), (32, 32 * b), (24, 24 * b),
                                                        (6, 48 * b), (12, 96 * b))]
    shapes += [d(16, 16 * b, b, prefill=((128, 0),)), d(32, 16 * b, b, spread=True, prefill=((256, 16 * b),)),
               d(1, 8 * b, b, prefill=((32, 0),)), d(32, 8 * b, b, prefill=((512, 0),)),
               d(8, 32 * b, b, spread=True, prefill=((64, 0), (64, 0)))]
    # Serving steps are mostly a running decode batch with one prefill chunk mixed in (the
    # step that produces a request's first token): cover that mix across batch sizes,
    # contexts and chunk sizes, so the fit does not extrapolate TTFT steps from pure ones.
    shapes += [d(n, ctx * b, b, spread=True, prefill=((c, k * b),))
               for n, ctx, c, k in ((4, 16, 32, 0), (4, 32, 256, 0), (8, 16, 128, 8), (8, 64, 32, 0),
                                    (16, 32, 64, 0), (16, 8, 256, 16), (24, 32, 32, 0), (24, 16, 128, 0),
                                    (32, 32, 64, 8), (32, 16, 16, 0), (16, 32, 128, 64))]
    # chat prompts are often a few tokens: a tiny chunk beside decodes prices the mixed step's intercept
    shapes += [d(n, ctx * b, b, spread=n > 1, prefill=((c, 0),)) for n, ctx, c in ((1, 8, 4), (4, 16, 8), (16, 32, 4))]
    return shapes


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


def fit_linear(samples: list[Sample], weights: list[float] | None = None) -> tuple[dict[str, float], np.ndarray]:
    """Non-negative least squares on relative error (each sample's error times its weight,
    default 1); returns (coefficients, predictions)."""
    x = np.array([s.shape.features() for s in samples], dtype=float)
    y = np.array([s.seconds for s in samples], dtype=float)
    w = (1.0 if weights is None else np.asarray(weights, dtype=float)) / y
    xw, yw = x * w[:, None], y * w
    active = [j for j in range(x.shape[1]) if x[:, j].any()]
    coef = np.zeros(x.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(xw[:, active], yw, rcond=None)
        if (sol >= 0).all():
            coef[:] = 0
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))   # drop the most negative term and refit
    return dict(zip(COEFFS, (float(c) for c in coef))), x @ coef


def fit_report(samples: list[Sample], predicted: np.ndarray) -> dict:
    y = np.array([s.seconds for s in samples])
    ape = np.abs(predicted - y) / y
    ss_res = float(((predicted - y) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum()) or 1e-30
    return {"mape": float(ape.mean()), "median_ape": float(np.median(ape)), "max_ape": float(ape.max()),
            "r2": 1.0 - ss_res / ss_tot}


def calibrate(model_spec="default", *, num_threads: int = 2, quick: bool = False, num_blocks: int | None = None,
              block_size: int = DEFAULT_BLOCK_SIZE, repeats: int | None = None, shapes: list[Shape] | None = None,
              out: str | Path | None = None, name: str | None = None, seed: int = 0,
              dtype: torch.dtype = torch.float32, serving_steps: int | None = None,
              progress: Callable[[str], None] | None = None) -> Calibration:
    """Measure, fit and (if ``out``) write the profile YAML.  Default: SmolLM2-135M.
    ``serving_steps`` (default 300, 0 when ``quick``): steps of the serving pass
    (``calibrate_serving.py``), fitted together with the grid, each half of the weight."""
    from .loader import build_model

    t0 = time.perf_counter()
    loaded = load_model(model_spec)
    cfg = loaded.config
    shapes = shapes or default_grid(quick, block_size)
    need_tokens = max(max((c + k for s in shapes for c, k in s.prefill), default=0),
                      max((k + 1 for s in shapes for k in s.decode), default=0))
    if need_tokens > cfg.max_position:
        raise ValueError(f"calibration grid needs {need_tokens} positions; the model has {cfg.max_position}")
    if num_blocks is None:
        num_blocks = (256 * block_size if quick else DEFAULT_KV_TOKENS) // block_size
    parent_blocks = -(-max(s.max_context() for s in shapes) // block_size)

    def blocks(shape: Shape) -> int:
        return sum(-(-(c + k) // block_size) for c, k in shape.prefill) + \
            sum(-(-(k + 1) // block_size) for k in shape.decode)

    fitting = [s for s in shapes if parent_blocks + blocks(s) <= num_blocks]
    if progress and len(fitting) < len(shapes):
        progress(f"calibrate: skipping {len(shapes) - len(fitting)} shapes larger than the {num_blocks}-block pool")
    if len(fitting) < 8:
        raise ValueError(f"only {len(fitting)} calibration shapes fit in {num_blocks} KV blocks; give more KV")
    shapes = fitting
    runner = ModelRunner(build_model(loaded, dtype), num_blocks=num_blocks, block_size=block_size,
                         num_host_blocks=num_blocks, num_threads=num_threads, seed=seed)
    samples = measure(runner, shapes, repeats or (3 if quick else 5), seed, progress)
    swap_tokens = min(cfg.max_position, (num_blocks // 2) * block_size, 64 if quick else 2048)
    swap = measure_swap(runner, swap_tokens, 3, seed)
    serving_steps = (0 if quick else 300) if serving_steps is None else serving_steps
    served = measure_serving(runner, serving_steps, np.random.default_rng(seed + 1)) if serving_steps else []
    if progress and served:
        progress(f"calibrate: serving pass, {len(served)} steps done")
    weights = [1.0] * len(samples) + [len(samples) / max(1, len(served))] * len(served)
    coeffs, _ = fit_linear(samples + served, weights)
    base = default_cpu_profile(loaded, num_threads)
    pname = name or f"{model_name(loaded).removesuffix('.gguf')}-cpu{num_threads}t"
    prof = base.model_copy(update=dict(name=pname, **coeffs, swap_bandwidth=max(swap["bandwidth"], 1.0)))
    prof = real_profile(loaded, prof, num_blocks=num_blocks, block_size=block_size, dtype=dtype)
    prof = Profile.model_validate(prof.model_dump())
    predicted = np.array([s.shape.predict(prof) for s in samples])
    serving = {}
    if served:
        measured = np.array([s.seconds for s in served])
        pred = np.array([s.shape.predict(prof) for s in served])
        serving = {"steps": len(served), "median_ape": float(np.median(np.abs(pred - measured) / measured)),
                   "bias": float(measured.sum() / pred.sum())}
    cal = Calibration(prof, samples, predicted.tolist(), fit_report(samples, predicted), swap,
                      time.perf_counter() - t0, serving)
    if out is not None:
        write_profile(cal, out, source=loaded.source, num_threads=num_threads)
    return cal


def write_profile(cal: Calibration, path: str | Path, *, source: str = "", num_threads: int = 2) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    data = cal.profile.model_dump(mode="json")
    f = cal.fit
    header = (f"# tokenfair calibrate: linear step-time fit for {source or 'the model'} on {num_threads} thread(s)\n"
              f"# fit over {len(cal.samples)} shapes: mean |err| {f['mape']:.1%}, median {f['median_ape']:.1%}, "
              f"max {f['max_ape']:.1%}, R^2 {f['r2']:.3f}; swap {cal.swap['bandwidth'] / 1e9:.2f} GB/s\n")
    p.write_text(header + yaml.safe_dump(data, sort_keys=False))
    return p
