"""A request's engine-side state: ``GenerationPayload`` (what a caller with real token ids
hands in: prompt, sampling, stop conditions, a streaming callback) and ``EngineSeq`` (what
``RealEngine`` keeps per request: the full token list, the target length, stop ids), plus the
vocabulary synthetic trace prompts are drawn from.

Invariant: ``EngineSeq.tokens`` is the prompt followed by every sampled token, in order; the
scheduler's ``num_computed`` says how much of it the KV cache holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..core.request import Request
from .loader import LoadedModel
from .sampling import GREEDY, SamplingParams

TokenCallback = Callable[[int | None, str | None], None]


@dataclass
class GenerationPayload:
    """Engine-side data of a request with real token ids (HTTP service, tests).

    ``on_token(token_id, finish_reason)`` is called for every sampled token
    (``finish_reason`` set on the last one: "length", "stop"), and once with
    ``(None, reason)`` if the request fails or is dropped before finishing.
    The engine fills ``output_ids`` and ``finish_reason``.
    """

    prompt_ids: list[int]
    sampling: SamplingParams = GREEDY
    max_new_tokens: int | None = None
    stop_token_ids: tuple[int, ...] | None = None   # None: the model's EOS ids
    stop_strings: tuple[str, ...] = ()
    ignore_eos: bool = False
    on_token: TokenCallback | None = None
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None


class EngineSeq:
    __slots__ = ("req", "seq_id", "tokens", "num_prompt", "target", "sampling", "stop_ids",
                 "stop_strings", "payload", "kv_lost", "done")

    def __init__(self, req: Request, num_prompt: int, target: int, sampling: SamplingParams,
                 stop_ids: frozenset[int], stop_strings: tuple[str, ...],
                 payload: GenerationPayload | None, tokens: list[int] | None) -> None:
        self.req = req
        self.seq_id = req.request_id
        self.tokens = tokens          # None until first scheduled (synthetic prompts are lazy)
        self.num_prompt = num_prompt
        self.target = target          # generated tokens at which the request is finished
        self.sampling = sampling
        self.stop_ids = stop_ids
        self.stop_strings = stop_strings
        self.payload = payload
        self.kv_lost = False          # a swap-out failed: fail the request at swap-in
        self.done = False

    @property
    def num_generated(self) -> int:
        return 0 if self.tokens is None else len(self.tokens) - self.num_prompt


def plain_vocab(loaded: LoadedModel | None, config) -> np.ndarray:
    special: set[int] = set(config.eos_token_ids)
    if config.bos_token_id is not None:
        special.add(config.bos_token_id)
    tok = loaded.tokenizer if loaded is not None else None
    if tok is not None:
        try:
            for tid, added in tok.get_added_tokens_decoder().items():
                if added.special:
                    special.add(int(tid))
        except AttributeError:  # pragma: no cover - very old tokenizers
            pass
        vocab = min(config.vocab_size, tok.get_vocab_size(with_added_tokens=True))
    else:
        vocab = config.vocab_size
    ids = np.array([i for i in range(vocab) if i not in special], dtype=np.int64)
    if ids.size == 0:
        raise ValueError("the vocabulary has no non-special token")
    return ids
