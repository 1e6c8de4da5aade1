"""Token sampling: greedy, temperature and nucleus (top-p), with per-request seeds.

Invariants: ``temperature == 0`` means greedy (argmax, no randomness consumed); every
non-greedy request draws from its OWN ``torch.Generator`` (seeded from ``seed`` when
given), so a request's samples do not depend on what else is in the batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .seed_range import MAX_SEED_EXCLUSIVE, MIN_SEED


class InvalidSamplingError(ValueError):
    """A sampling parameter the sampler cannot take; ``param`` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise InvalidSamplingError("temperature", f"must be a finite number >= 0, got {self.temperature}")
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise InvalidSamplingError("top_p", f"must be in (0, 1], got {self.top_p}")
        seed = self.seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)
                                 or not MIN_SEED <= seed < MAX_SEED_EXCLUSIVE):
            raise InvalidSamplingError("seed", f"must be an integer in [-2^63, 2^64), got {seed!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


GREEDY = SamplingParams()


def sample_tokens(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> list[int]:
    """Sample one token per row of ``logits`` ``[S, vocab]``.

    Greedy rows use argmax; the other rows are tempered, top-p filtered and sampled by
    inverse-CDF with one uniform draw from that row's generator (batched apart from the draw).
    """
    logits = logits.detach().float().cpu()  # [S, vocab] is small; sampling runs on the host
    chosen = logits.argmax(dim=-1)
    random_rows = [i for i, p in enumerate(params) if not p.is_greedy]
    if random_rows:
        rows = torch.tensor(random_rows)
        temperatures = torch.tensor([params[i].temperature for i in random_rows], dtype=torch.float32)
        top_ps = torch.tensor([params[i].top_p for i in random_rows], dtype=torch.float32)
        probs = torch.softmax(logits[rows].float() / temperatures[:, None], dim=-1)
        sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs = torch.where(mass_before < top_ps[:, None], sorted_probs, 0.0)
        cdf = sorted_probs.cumsum(dim=-1)
        draws = torch.cat([torch.rand(1, generator=generators[i]) for i in random_rows])
        picks = torch.searchsorted(cdf, (draws * cdf[:, -1])[:, None], right=True).squeeze(1)
        picks = picks.clamp(max=cdf.shape[-1] - 1)
        chosen[rows] = sorted_ids.gather(1, picks[:, None]).squeeze(1)
    return chosen.tolist()


def make_generator(seed: int) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator
