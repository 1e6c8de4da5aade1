"""A synthetic workload whose prompts share prefixes: per-tenant system prompts and
multi-turn chats, with Mooncake-style prefix block hashes (``TraceRow.prefix_hashes``).

Conversations arrive as a Poisson process (``conversations_per_s``); each belongs to a tenant
drawn with Zipf-like popularity (tenant i has weight ``1/(i+1)``) and has a geometric number
of turns (mean ``mean_turns``).  Turn j's prompt is the tenant's system prompt
(``system_tokens``), the conversation so far (every earlier user message and answer) and a
new user message; the next turn arrives an exponential think time (mean ``think_s``) later.
Prompt block k (``block_tokens`` tokens, 512 as in Mooncake's ``hash_ids``) gets an id that
depends on the whole prefix up to its end: equal ids are equal prefixes.  A partial last
block gets an id of its own (it is not a prefix of the next turn's block).
Deterministic for a seed (``random.Random(seed)``).  Spec: ``chat[:key=value,...]``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields

from .workload import TraceRow, Workload, WorkloadError


@dataclass(frozen=True)
class ChatSpec:
    num_tenants: int = 8                 # >= 1
    conversations_per_s: float = 2.0     # > 0
    duration_s: float = 600.0            # > 0: conversations start before it
    mean_turns: float = 4.0              # >= 1
    system_tokens: int = 2048            # >= 0, per tenant
    mean_user_tokens: int = 200          # >= 1
    mean_output_tokens: int = 200        # >= 1
    think_s: float = 30.0                # >= 0
    block_tokens: int = 512              # >= 1
    max_prompt_tokens: int = 32_000      # a conversation ends before its prompt passes this


def parse_chat_spec(opts: str) -> ChatSpec:
    """``key=value,...`` over :class:`ChatSpec`'s fields; a bad key or value names the fix."""
    kinds = {f.name: f.type for f in fields(ChatSpec)}
    kwargs: dict[str, object] = {}
    for item in filter(None, opts.split(",")):
        k, eq, v = item.partition("=")
        k = k.strip()
        if not eq or k not in kinds:
            raise WorkloadError(f"chat workload: option {item!r}: use key=value with key one of {sorted(kinds)}")
        try:
            kwargs[k] = int(v) if kinds[k] in (int, "int") else float(v)
        except ValueError:
            raise WorkloadError(f"chat workload: option {k!r}: expected a number, got {v!r}") from None
    spec = ChatSpec(**kwargs)   # type: ignore[arg-type]
    if (spec.num_tenants < 1 or spec.conversations_per_s <= 0 or spec.duration_s <= 0 or spec.mean_turns < 1
            or spec.system_tokens < 0 or spec.mean_user_tokens < 1 or spec.mean_output_tokens < 1
            or spec.think_s < 0 or spec.block_tokens < 1 or spec.max_prompt_tokens < 2):
        raise WorkloadError(f"chat workload: out-of-range option in {spec}; see tokenfair.workloads.prefix.ChatSpec")
    return spec


class _Ids:
    """Small integer ids for prefix keys, in first-seen order."""

    def __init__(self) -> None:
        self._ids: dict[tuple, int] = {}

    def of(self, key: tuple) -> int:
        return self._ids.setdefault(key, len(self._ids))


def _hashes(ids: _Ids, tenant: str, conv: int, system_tokens: int, prompt_tokens: int, bs: int,
            seq: int) -> tuple[int, ...]:
    out = []
    for k in range(prompt_tokens // bs):
        end = (k + 1) * bs
        out.append(ids.of(("sys", tenant, k)) if end <= system_tokens else ids.of(("conv", tenant, conv, k)))
    if prompt_tokens % bs:
        out.append(ids.of(("tail", seq)))
    return tuple(out)


def generate_chat(spec: ChatSpec, seed: int = 0) -> Workload:
    rnd = random.Random(seed)
    width = max(2, len(str(spec.num_tenants - 1)))
    tenants = [f"t{i:0{width}d}" for i in range(spec.num_tenants)]
    weights = [1.0 / (i + 1) for i in range(spec.num_tenants)]
    ids = _Ids()
    pending: list[tuple[float, str, int, int, int]] = []   # (arrival, tenant, conv, prompt, output)
    t = 0.0
    conv = 0
    while True:
        t += rnd.expovariate(spec.conversations_per_s)
        if t >= spec.duration_s:
            break
        tenant = rnd.choices(tenants, weights)[0]
        context = spec.system_tokens
        at = t
        turns = 1
        while True:
            prompt = context + max(1, int(rnd.expovariate(1.0 / spec.mean_user_tokens)))
            output = max(1, int(rnd.expovariate(1.0 / spec.mean_output_tokens)))
            if prompt > spec.max_prompt_tokens:
                break
            pending.append((at, tenant, conv, prompt, output))
            context = prompt + output
            if rnd.random() < 1.0 / spec.mean_turns:
                break
            turns += 1
            at += rnd.expovariate(1.0 / spec.think_s) if spec.think_s > 0 else 0.0
        conv += 1
    pending.sort(key=lambda p: (p[0], p[2]))
    rows = [TraceRow(request_id=f"chat-{i}", arrival_s=at, tenant=tenant, prompt_tokens=prompt,
                     output_tokens=output,
                     prefix_hashes=_hashes(ids, tenant, c, spec.system_tokens, prompt, spec.block_tokens, i))
            for i, (at, tenant, c, prompt, output) in enumerate(pending)]
    return Workload(f"chat-s{seed}", tuple(rows))
