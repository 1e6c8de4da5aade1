"""Decode-throughput benchmark: our ``ModelRunner`` vs transformers' ``generate``.

Same weights (``LlamaForCausalLM`` loaded from our dequantised state dict), same dtype,
same batch of equal-length random prompts, greedy, a fixed number of new tokens (EOS
ignored), ``torch.set_num_threads(N)`` for both.  Decode throughput is ``batch / median
decode-step time``: every decode step is timed (ours directly, transformers through a
streamer that timestamps each generated token), so prefill is excluded the same way and
bursts of machine noise do not move the median.  The engines alternate within each
repeat.  ``e2e`` columns: new tokens / whole ``generate`` time (prefill included).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from .loader import LoadedModel, build_model
from .setup import load_model
from .runner import ModelRunner, SeqWork


@dataclass
class BenchRow:
    batch: int
    ours_tok_s: float             # decode tokens/s (batch / median step)
    hf_tok_s: float | None
    ratio: float | None
    ours_step_ms: float
    hf_step_ms: float | None
    ours_e2e_tok_s: float
    hf_e2e_tok_s: float | None
    same_tokens: bool | None      # greedy outputs of both engines identical

    def as_dict(self) -> dict:
        return asdict(self)


def hf_model_from_loaded(loaded: LoadedModel, dtype: torch.dtype = torch.float32):
    """A transformers ``LlamaForCausalLM`` holding exactly our (dequantised) weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    c = loaded.config
    eos = list(c.eos_token_ids)
    config = LlamaConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                         num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
                         num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim, rope_theta=c.rope_theta,
                         rms_norm_eps=c.rms_norm_eps, max_position_embeddings=c.max_position,
                         tie_word_embeddings=c.tie_embeddings, bos_token_id=c.bos_token_id,
                         eos_token_id=eos[0] if len(eos) == 1 else (eos or None))
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    state = {}
    for k, v in loaded.state_dict.items():
        state[k if k == "lm_head.weight" else f"model.{k}"] = v.to(dtype)
    if c.tie_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [m for m in missing if "rotary_emb" not in m]
    if missing or unexpected:
        raise RuntimeError(f"weights do not map onto LlamaForCausalLM: missing {missing}, unexpected {unexpected}")
    if c.tie_embeddings:
        model.tie_weights()
    # rotary buffers were created on meta: rebuild them on the CPU
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    return model.eval()


def _ours_generate(runner: ModelRunner, prompts: list[list[int]], new_tokens: int, steps: list[float] | None = None
                   ) -> list[list[int]]:
    ids = [f"b{i}" for i in range(len(prompts))]
    out = runner.step([SeqWork(s, p, 0, True) for s, p in zip(ids, prompts)])
    gen = [[out.sampled[s]] for s in ids]
    pos = len(prompts[0])
    for _ in range(new_tokens - 1):
        t0 = time.perf_counter()
        out = runner.step([SeqWork(s, [g[-1]], pos, True) for s, g in zip(ids, gen)])
        for s, g in zip(ids, gen):
            g.append(out.sampled[s])
        if steps is not None:
            steps.append(time.perf_counter() - t0)
        pos += 1
    for s in ids:
        runner.free(s)
    return gen


class _StepTimer:
    """A transformers streamer that timestamps every generated token (first put = prompt)."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def put(self, value) -> None:
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        pass

    def decode_steps(self) -> list[float]:
        # stamps[0]: prompt, stamps[1]: first token (after prefill), then one per decode step
        return [b - a for a, b in zip(self.stamps[1:], self.stamps[2:])]


def _hf_generate(model, prompts: list[list[int]], new_tokens: int, steps: list[float] | None = None
                 ) -> list[list[int]]:
    x = torch.tensor(prompts)
    timer = _StepTimer() if steps is not None else None
    with torch.inference_mode():
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0,
                             streamer=timer)
    if timer is not None:
        steps.extend(timer.decode_steps())
    return out[:, x.shape[1]:].tolist()


def bench(model_spec="default", batches=(1, 8, 32), new_tokens: int = 32, prompt_len: int = 32,
          repeats: int = 3, num_threads: int = 2, include_hf: bool = True, dtype: torch.dtype = torch.float32,
          seed: int = 0, progress=None) -> list[BenchRow]:
    loaded = load_model(model_spec)
    torch.set_num_threads(num_threads)
    max_batch = max(batches)
    bs = 16
    blocks = max_batch * (-(-(prompt_len + new_tokens) // bs)) + 8
    runner = ModelRunner(build_model(loaded, dtype), num_blocks=blocks, block_size=bs, num_threads=num_threads)
    hf = hf_model_from_loaded(loaded, dtype) if include_hf else None
    torch.set_num_threads(num_threads)
    rng = np.random.default_rng(seed)
    vocab = loaded.config.vocab_size
    rows = []
    for b in batches:
        prompts = rng.integers(3, vocab, size=(b, prompt_len)).tolist()
        ours_steps: list[float] = []
        hf_steps: list[float] = []
        ours_total, hf_total = [], []
        # warm-up (and correctness check) once per batch size
        mine = _ours_generate(runner, prompts, new_tokens)
        theirs = _hf_generate(hf, prompts, new_tokens) if hf is not None else None
        for _ in range(repeats):
            t0 = time.perf_counter()
            _ours_generate(runner, prompts, new_tokens, ours_steps)
            ours_total.append(time.perf_counter() - t0)
            if hf is not None:
                t0 = time.perf_counter()
                _hf_generate(hf, prompts, new_tokens, hf_steps)
                hf_total.append(time.perf_counter() - t0)
        o_step = statistics.median(ours_steps)
        h_step = statistics.median(hf_steps) if hf_steps else None
        row = BenchRow(
            batch=b, ours_tok_s=b / o_step, hf_tok_s=None if h_step is None else b / h_step,
            ratio=None if h_step is None else h_step / o_step, ours_step_ms=1e3 * o_step,
            hf_step_ms=None if h_step is None else 1e3 * h_step,
            ours_e2e_tok_s=b * new_tokens / statistics.median(ours_total),
            hf_e2e_tok_s=b * new_tokens / statistics.median(hf_total) if hf_total else None,
            same_tokens=None if theirs is None else mine == theirs)
        rows.append(row)
        if progress:
            progress(format_row(row))
    return rows


def format_header() -> str:
    return (f"{'batch':>5}{'ours tok/s':>12}{'hf tok/s':>10}{'ratio':>7}{'ours ms/step':>14}{'hf ms/step':>12}"
            f"{'ours e2e':>10}{'hf e2e':>8}{'same tokens':>13}")


def format_row(r: BenchRow) -> str:
    def f(v, fmt):
        return "-" if v is None else fmt.format(v)
    same = "-" if r.same_tokens is None else ("yes" if r.same_tokens else "no")
    return (f"{r.batch:>5}{r.ours_tok_s:>12.1f}{f(r.hf_tok_s, '{:.1f}'):>10}{f(r.ratio, '{:.2f}x'):>7}"
            f"{r.ours_step_ms:>14.1f}{f(r.hf_step_ms, '{:.1f}'):>12}{r.ours_e2e_tok_s:>10.1f}"
            f"{f(r.hf_e2e_tok_s, '{:.1f}'):>8}{same:>13}")


def bench_table(rows: list[BenchRow]) -> str:
    return "\n".join([format_header(), *(format_row(r) for r in rows)])
