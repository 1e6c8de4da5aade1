"""Step-time cost model and hardware/model profiles.

Roofline form (profile ``kind: roofline``), for a Llama-style model in bf16 with
``P`` non-embedding parameters, ``L`` layers, hidden ``d``, ``d_kv = n_kv_heads * head_dim``,
vocabulary ``V``; one engine step processes ``N`` tokens: prefill chunks ``(c_j, k_j)`` (``c``
new tokens over ``k`` cached ones) and decode sequences with contexts ``k_i``::

    flops = 2 P N + 2 V d S                                  (S = sequences sampled)
          + 4 L d [ sum_j c_j (k_j + c_j / 2) + sum_i k_i ]   (attention)
    bytes = 2 P_total + 4 L d_kv ( sum of contexts + N )      (weights + KV read/write, bf16)
    step_s = overhead_s + max(flops / (peak_flops * mfu), bytes / (bandwidth * mbu))

Linear form (``kind: linear``, e.g. the VTC artifact's A10G fit)::

    step_s = prefill_batch_s [if any prefill] + prefill_token_s * sum c_j
           + prefill_attn_s * sum c_j (k_j + c_j / 2)
           + decode_base_s [if any decode] + decode_seq_s * n_decode + decode_ctx_s * sum k_i

``prefill_attn_s`` prices a prefill chunk's attention over its cached context (and itself);
it defaults to 0, which leaves every other linear profile's step times exactly as they were.

Swapping a request's KV moves ``kv_bytes_per_token * tokens`` at ``swap_bandwidth`` in each
direction.  KV capacity (``kv_capacity_tokens``) and block size define the paged pool.
"""

from __future__ import annotations

import argparse
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..contracts.contract import format_errors
from .stepcost import LinearCost, RooflineCost, StepCost


class ProfileError(ValueError):
    """A profile name or file that cannot be used."""


class Profile(BaseModel):
    # every number finite: an infinite cost (``prefill_token_s: .inf``) made a step's time NaN
    # and crashed the run
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str
    kind: Literal["roofline", "linear"] = "roofline"
    # model
    params_nonembed: float = Field(default=7.0e9, gt=0)
    params_total: float = Field(default=8.0e9, gt=0)
    num_layers: int = Field(default=32, gt=0)
    hidden: int = Field(default=4096, gt=0)
    d_kv: int = Field(default=1024, gt=0)
    vocab: int = Field(default=128_256, gt=0)
    # hardware
    peak_flops: float = Field(default=312e12, gt=0)
    bandwidth: float = Field(default=2.0e12, gt=0)
    mfu: float = Field(default=0.65, gt=0, le=1)
    mbu: float = Field(default=0.70, gt=0, le=1)
    overhead_s: float = Field(default=0.003, ge=0)
    # linear form
    prefill_batch_s: float = Field(default=0.0, ge=0)
    prefill_token_s: float = Field(default=0.0, ge=0)
    prefill_attn_s: float = Field(default=0.0, ge=0)   # per sum c_j (k_j + c_j / 2)
    decode_base_s: float = Field(default=0.0, ge=0)
    decode_seq_s: float = Field(default=0.0, ge=0)
    decode_ctx_s: float = Field(default=0.0, ge=0)
    # memory
    kv_capacity_tokens: int = Field(default=400_000, gt=0)
    block_size: int = Field(default=16, gt=0)
    kv_bytes_per_token: float = Field(default=131_072, gt=0)
    swap_bandwidth: float = Field(default=25e9, gt=0)
    swap_capacity_tokens: int = Field(default=200_000, ge=0)

    @property
    def num_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_size

    @cached_property
    def cost(self) -> StepCost:
        """The step-time arithmetic on this profile's constants (``stepcost.py``)."""
        if self.kind == "linear":
            return LinearCost(self.prefill_batch_s, self.prefill_token_s, self.prefill_attn_s, self.decode_base_s,
                              self.decode_seq_s, self.decode_ctx_s, self.overhead_s)
        # folded as Python evaluates the expanded formula left to right (see stepcost.py)
        return RooflineCost(2 * self.params_nonembed, 2 * self.vocab * self.hidden, 4 * self.num_layers * self.hidden,
                            2 * self.params_total, 4 * self.num_layers * self.d_kv, self.peak_flops * self.mfu,
                            self.bandwidth * self.mbu, self.overhead_s)

    def step_s(self, prefill: list[tuple[int, int]], decode_contexts_sum: int, num_decode: int) -> float:
        """Seconds for one step: prefill chunks ``[(new_tokens, cached_tokens)]`` and
        ``num_decode`` decode sequences whose contexts sum to ``decode_contexts_sum``."""
        return self.cost.step_s(prefill, decode_contexts_sum, num_decode)

    def swap_s(self, tokens: int) -> float:
        return tokens * self.kv_bytes_per_token / self.swap_bandwidth


def _kv_capacity(gpu_bytes: float, weight_bytes: float, kv_per_token: float, util: float = 0.9) -> int:
    return int((gpu_bytes * util - weight_bytes) / kv_per_token)


_GB = 1e9
_LLAMA3_8B: dict[str, Any] = dict(params_nonembed=6.98e9, params_total=8.03e9, num_layers=32, hidden=4096, d_kv=1024,
                  vocab=128_256, kv_bytes_per_token=32 * 4 * 1024)
_LLAMA2_7B: dict[str, Any] = dict(params_nonembed=6.48e9, params_total=6.74e9, num_layers=32, hidden=4096, d_kv=4096,
                  vocab=32_000, kv_bytes_per_token=32 * 4 * 4096)
_LLAMA3_70B_TP4: dict[str, Any] = dict(params_nonembed=68.5e9 / 4, params_total=70.6e9 / 4, num_layers=80, hidden=8192,
                       d_kv=1024 // 4 * 1, vocab=128_256 // 4, kv_bytes_per_token=80 * 4 * 1024 / 4)

BUILTIN_PROFILES: dict[str, Profile] = {
    "llama3-8b-a100": Profile(name="llama3-8b-a100", **_LLAMA3_8B, peak_flops=312e12, bandwidth=2.0e12,
                              overhead_s=0.003, kv_capacity_tokens=_kv_capacity(80 * _GB, 16.1 * _GB, 131_072)),
    "llama3-8b-h100": Profile(name="llama3-8b-h100", **_LLAMA3_8B, peak_flops=989e12, bandwidth=3.35e12,
                              overhead_s=0.003, kv_capacity_tokens=_kv_capacity(80 * _GB, 16.1 * _GB, 131_072)),
    "llama2-7b-a100": Profile(name="llama2-7b-a100", **_LLAMA2_7B, peak_flops=312e12, bandwidth=2.0e12,
                              overhead_s=0.003, kv_capacity_tokens=_kv_capacity(80 * _GB, 13.5 * _GB, 524_288)),
    # 70B with tensor parallelism over 4 H100s: per-GPU share of weights/KV, plus all-reduce overhead.
    "llama3-70b-4xh100": Profile(name="llama3-70b-4xh100", **_LLAMA3_70B_TP4, peak_flops=989e12,
                                 bandwidth=3.35e12, overhead_s=0.012,
                                 kv_capacity_tokens=_kv_capacity(80 * _GB, 35.3 * _GB, 81_920)),
    # The VTC artifact's fitted linear model (A10G, Llama-2-7B), 10,000-token KV pool.
    "vtc-a10g-llama2-7b": Profile(name="vtc-a10g-llama2-7b", kind="linear", **_LLAMA2_7B,
                                  prefill_batch_s=0.036, prefill_token_s=0.000213, decode_base_s=0.0163,
                                  decode_seq_s=0.000245, decode_ctx_s=2.0e-6, overhead_s=0.0,
                                  kv_capacity_tokens=10_000, swap_bandwidth=12e9),
}
DEFAULT_PROFILE = "llama3-8b-a100"


def load_profile(name_or_path: str | None) -> Profile:
    """A built-in profile by name, or a YAML file with the fields of :class:`Profile`."""
    if name_or_path is None:
        return BUILTIN_PROFILES[DEFAULT_PROFILE]
    if name_or_path in BUILTIN_PROFILES:
        return BUILTIN_PROFILES[name_or_path]
    p = Path(name_or_path)
    if not p.exists():
        raise ProfileError(f"profile {name_or_path!r}: not a built-in profile {sorted(BUILTIN_PROFILES)} nor a file")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as err:
        raise ProfileError(f"{p}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ProfileError(f"{p}: a profile must be a YAML mapping")
    data.setdefault("name", p.stem)
    try:
        return Profile.model_validate(data)
    except ValidationError as err:
        raise ProfileError(format_errors(err, str(p))) from None


def profile_arg(name_or_path: str) -> str:
    """:func:`load_profile`'s argument checked as an argparse ``type`` (the scripts'
    ``--profile``): a profile that does not load is a usage error (exit 2)."""
    try:
        load_profile(name_or_path)
    except ProfileError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return name_or_path
