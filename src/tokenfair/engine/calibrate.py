"""Calibrate the simulator's LINEAR step-time profile against the real engine on this machine.

Measure ``ModelRunner.step`` over a grid of batch shapes -- prefill chunks of ``c`` new
tokens over ``k`` cached ones, decode batches of ``b`` sequences at contexts ``ctx_i``, and
mixed steps (needed to tell the per-step constants apart) -- then fit, by non-negative
least squares on RELATIVE error (numpy only)::

    step_s = prefill_batch_s [if prefill] + prefill_token_s * sum c + prefill_attn_s * sum c (k + c/2)
           + decode_base_s [if decode] + decode_seq_s * b + decode_ctx_s * sum ctx_i + overhead_s

The grid is timed by ``calibrate_measure.py`` (private copies of a prefilled parent's
blocks; decode batches mostly with contexts spread over [ctx/4, ctx]); a serving pass
(``calibrate_serving.py``: random requests under continuous batching) is fitted with it at
equal total weight, so the fit sees steps in the state mix of a running engine.  The swap
bandwidth is measured by swapping a long sequence out and back in.  The result is a profile
YAML that ``tokenfair.core.costmodel.load_profile`` reads, with the engine's KV geometry.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import yaml

from ..core.costmodel import Profile
from .real_engine import DEFAULT_BLOCK_SIZE, DEFAULT_KV_TOKENS
from .setup import default_cpu_profile, load_model, model_name, real_profile
from .calibrate_measure import Sample, Shape, measure, measure_swap
from .calibrate_serving import measure_serving
from .runner import ModelRunner

COEFFS = ("prefill_batch_s", "prefill_token_s", "prefill_attn_s", "decode_base_s", "decode_seq_s", "decode_ctx_s",
          "overhead_s")


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
