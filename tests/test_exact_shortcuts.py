"""The shortcuts the simulator's hot paths take are bit-for-bit the long way round."""

import random

from hypothesis import given
from hypothesis import strategies as st

from tokenfair.costmodel import BUILTIN_PROFILES
from tokenfair.exactfloat import add_repeated


def test_decode_and_chunk_step_functions_equal_step_s_bit_for_bit():
    rng = random.Random(7)
    for prof in BUILTIN_PROFILES.values():
        decode, chunk = prof.decode_step_fn(), prof.chunk_step_fn()
        for _ in range(3000):
            n, ctx, c = rng.randint(0, 512), rng.randint(0, 20_000_000), rng.randint(1, 16_384)
            assert decode(ctx, n) == prof.step_s([], ctx, n)
            assert chunk(c, ctx, n) == prof.step_s([(c, 0)], ctx, n)


def _loop(acc, x, k):
    for _ in range(k):
        acc += x
    return acc


@given(acc=st.one_of(st.integers(-10**6, 10**6).map(float), st.floats(-1e6, 1e6)),
       x=st.one_of(st.integers(0, 10**4).map(float), st.floats(0, 1e4)), k=st.integers(0, 300))
def test_add_repeated_equals_the_loop(acc, x, k):
    assert add_repeated(acc, x, k) == _loop(acc, x, k)
