"""The shortcuts the simulator's hot paths take are bit-for-bit the long way round."""

import random

from hypothesis import given
from hypothesis import strategies as st

from tokenfair.core.costmodel import BUILTIN_PROFILES
from tokenfair.core.exactfloat import add_repeated
from tokenfair.core.stepcost import StepCost


def test_decode_and_chunk_step_functions_equal_step_s_bit_for_bit():
    rng = random.Random(7)
    for prof in BUILTIN_PROFILES.values():
        decode, chunk = prof.cost.decode_s, prof.cost.chunk_s
        for _ in range(3000):
            n, ctx, c = rng.randint(0, 512), rng.randint(0, 20_000_000), rng.randint(1, 16_384)
            assert decode(ctx, n) == prof.step_s([], ctx, n)
            assert chunk(c, ctx, n) == prof.step_s([(c, 0)], ctx, n)
            k = rng.choice([0, rng.randint(1, 512), rng.randint(0, 200_000)])
            assert chunk(c, ctx, n, k) == prof.step_s([(c, k)], ctx, n)


@given(ctx=st.integers(0, 20_000_000), n=st.integers(1, 512), now=st.floats(0, 1e5),
       horizon=st.one_of(st.just(float("inf")), st.floats(0, 50)), k_max=st.integers(0, 3000))
def test_a_decode_run_equals_its_steps_bit_for_bit(ctx, n, now, horizon, k_max):
    """Every profile kind's ``decode_run`` (constants hoisted out of the step loop) gives the
    end times and durations of stepping ``decode_s`` (``StepCost.decode_run``, the definition),
    and stops before the step at ``stop_s``."""
    for prof in BUILTIN_PROFILES.values():
        run = prof.cost.decode_run(ctx, n, now, now + horizon, k_max)
        assert run == StepCost.decode_run(prof.cost, ctx, n, now, now + horizon, k_max)


def test_decode_runs_from_many_contexts_equal_their_steps():
    """Short runs from 3,000 random (context, batch) pairs per profile: compute-bound and
    memory-bound steps alike."""
    rng = random.Random(11)
    for prof in BUILTIN_PROFILES.values():
        for _ in range(3000):
            ctx, n = rng.randint(0, 20_000_000), rng.randint(1, 512)
            assert (prof.cost.decode_run(ctx, n, 5.0, float("inf"), 4)
                    == StepCost.decode_run(prof.cost, ctx, n, 5.0, float("inf"), 4))


def _loop(acc, x, k):
    for _ in range(k):
        acc += x
    return acc


@given(acc=st.one_of(st.integers(-10**6, 10**6).map(float), st.floats(-1e6, 1e6)),
       x=st.one_of(st.integers(0, 10**4).map(float), st.floats(0, 1e4)), k=st.integers(0, 300))
def test_add_repeated_equals_the_loop(acc, x, k):
    assert add_repeated(acc, x, k) == _loop(acc, x, k)


def _brute_force(step, budget, ctx, n, target, k=0):
    """The largest multiple of 64 in [128, budget) that fits, else 128; the budget if <= 128."""
    if budget <= 128:
        return budget
    fits = [m for m in range(128, budget, 64) if step(m, ctx, n, k) <= target]
    return max(fits) if fits else 128


def test_shaped_budget_with_the_last_answer_first_equals_bisection():
    """``BudgetShaper.shaped`` (sched/fair/shaping.py) tries the previous step's answer first; on slowly and
    abruptly changing decode batches, for every profile and budgets that are and are not
    multiples of 64, it returns the largest fitting multiple of 64 (found by brute force)."""
    import signal

    def timeout(*_):
        raise TimeoutError("shaping did not terminate")

    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(20)
    try:
        _check_shaping()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _check_shaping():
    from tokenfair.sched.fair.shaping import BudgetShaper

    rng = random.Random(11)
    for prof in BUILTIN_PROFILES.values():
        shaper = BudgetShaper(prof.cost)
        step = prof.cost.chunk_s
        ctx, n = 40_000, 40
        for _ in range(3000):
            if rng.random() < 0.1:
                ctx, n = rng.randint(0, 4_000_000), rng.randint(1, 256)
            else:
                n = max(1, n + rng.randint(-2, 2))
                ctx = max(0, ctx + rng.randint(-3000, 3000))
            # multiples of 64 and not (a budget of 1000 made the old bisection loop forever)
            budget = rng.choice([2048, 2048, 1024, 512, 1000, 777, 200, 64])
            target = rng.choice([0.04, 0.08, 0.2]) * rng.uniform(0.5, 1.5)
            k = 0 if rng.random() < 0.5 else rng.randint(0, 60_000)     # the prefill's cached prefix
            if step(budget, ctx, n, k) <= target:
                continue                      # prefill_budget returns the budget itself
            assert shaper.shaped(budget, ctx, n, target, k) == _brute_force(step, budget, ctx, n, target, k)
