"""The seeds a sampler's generator takes (no torch import, so the HTTP schemas can check them).

``torch.Generator.manual_seed`` takes a 64-bit seed, signed or unsigned: [-2^63, 2^64);
anything else raises inside the engine's step.
"""

MIN_SEED = -(2 ** 63)
MAX_SEED_EXCLUSIVE = 2 ** 64
