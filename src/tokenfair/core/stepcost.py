"""The cost model's arithmetic: seconds per engine step, on constants folded from a profile.

:class:`~tokenfair.core.costmodel.Profile` (validated configuration) builds one of these once
(``Profile.cost``) and delegates ``step_s`` to it; the simulator calls it directly.  Kept
apart from the pydantic model so that it compiles (``_core.COMPILED_MODULES``).

Exactness: every method performs the float operations of the formulas below in the same
order, with each constant folded the way Python evaluates the expanded formula left to right
(``2 * params_nonembed * n == (2 * params_nonembed) * n``), so ``decode_s(ctx, n) ==
step_s([], ctx, n)`` and ``chunk_s(c, ctx, n, k) == step_s([(c, k)], ctx, n)`` bit for bit,
and ``decode_run`` gives a run of decode steps as ``decode_s`` step by step would
(``tests/test_exact_shortcuts.py``).

Roofline: ``overhead + max(flops / (peak_flops * mfu), bytes / (bandwidth * mbu))`` with
``flops = 2 P n + 2 V H seqs + 4 L H (attn + ctx)`` and ``bytes = 2 P_total + 4 L d_kv
(ctx_all + num_decode)``, where ``n`` counts the step's tokens, ``attn = sum c_j (k_j + c_j/2)``
over prefill chunks of ``c_j`` new tokens on ``k_j`` cached ones, ``ctx`` the decodes' context
sum and ``ctx_all`` every sequence's context.  Linear (a fitted form): ``overhead +
[prefill] (batch + token n_prefill + attn_coef attn) + [decode] (base + seq num_decode +
ctx_coef ctx)``.  All O(prefill chunks) per call.
"""

from __future__ import annotations


def _prefill_terms(prefill: list[tuple[int, int]]) -> tuple[int, float, int]:
    """(new tokens, ``attn = sum c (k + c/2)`` summed in chunk order, cached + new tokens)."""
    n_prefill = 0
    attn = 0.0
    ctx = 0
    for c, k in prefill:
        n_prefill += c
        attn += c * (k + c / 2)
        ctx += k + c
    return n_prefill, attn, ctx


class StepCost:
    def step_s(self, prefill: list[tuple[int, int]], decode_contexts_sum: int, num_decode: int) -> float:
        """Seconds for one step: prefill chunks ``[(new_tokens, cached_tokens)]`` and
        ``num_decode`` decode sequences whose contexts sum to ``decode_contexts_sum``."""
        raise NotImplementedError

    def decode_s(self, ctx: int, n: int) -> float:
        """``step_s([], ctx, n)``: a decode-only step (the simulator's decode runs)."""
        raise NotImplementedError

    def chunk_s(self, c: int, ctx: int, n: int, k: int = 0) -> float:
        """``step_s([(c, k)], ctx, n)``: one chunk of ``c`` new tokens on ``k`` cached ones
        beside ``n`` decodes."""
        raise NotImplementedError

    def decode_run(self, ctx: int, n: int, now: float, stop_s: float, k_max: int) -> tuple[list[float], list[float]]:
        """End times and durations of up to ``k_max`` decode-only steps of ``n`` requests from
        context sum ``ctx`` starting at ``now``, none starting at or after ``stop_s``: step j
        lasts ``decode_s(ctx + j n, n)``, added to the clock in order.  O(k)."""
        ends: list[float] = []
        durations: list[float] = []
        t = now
        for j in range(k_max):
            if stop_s <= t:
                break
            dt = self.decode_s(ctx + j * n, n)
            t += dt
            ends.append(t)
            durations.append(dt)
        return ends, durations

    def decode_run_end(self, ctx: int, n: int, now: float, stop_s: float, k_max: int,
                       busy_s: float) -> tuple[int, float, float, float]:
        """:meth:`decode_run` without its lists: (steps k, the last step's end time, ``busy_s``
        with every duration added in order, the last duration; ``(0, now, busy_s, 0.0)``
        when no step starts).  For a run whose per-step times nobody reads.  O(k)."""
        t = now
        dt = 0.0
        k = 0
        for j in range(k_max):
            if stop_s <= t:
                break
            dt = self.decode_s(ctx + j * n, n)
            t += dt
            busy_s += dt
            k += 1
        return k, t, busy_s, dt


class RooflineCost(StepCost):
    def __init__(self, params2: float, vocab_hidden2: float, layers_hidden4: float, params_total2: float,
                 layers_kv4: float, compute: float, memory: float, overhead_s: float) -> None:
        self.params2 = params2
        self.vocab_hidden2 = vocab_hidden2
        self.layers_hidden4 = layers_hidden4
        self.params_total2 = params_total2
        self.layers_kv4 = layers_kv4
        self.compute = compute              # peak_flops * mfu
        self.memory = memory                # bandwidth * mbu
        self.overhead_s = overhead_s

    def step_s(self, prefill: list[tuple[int, int]], decode_contexts_sum: int, num_decode: int) -> float:
        n_prefill, attn, prefill_ctx = _prefill_terms(prefill)
        ctx = decode_contexts_sum + prefill_ctx
        n = n_prefill + num_decode
        seqs = num_decode + len(prefill)
        flops = self.params2 * n + self.vocab_hidden2 * seqs + self.layers_hidden4 * (attn + decode_contexts_sum)
        nbytes = self.params_total2 + self.layers_kv4 * (ctx + num_decode)
        return self.overhead_s + max(flops / self.compute, nbytes / self.memory)

    def decode_s(self, ctx: int, n: int) -> float:
        flops = self.params2 * n + self.vocab_hidden2 * n + self.layers_hidden4 * (0.0 + ctx)
        nbytes = self.params_total2 + self.layers_kv4 * (ctx + n)
        a, b = flops / self.compute, nbytes / self.memory
        return self.overhead_s + (b if b > a else a)      # == max(a, b)

    def decode_run(self, ctx: int, n: int, now: float, stop_s: float, k_max: int) -> tuple[list[float], list[float]]:
        # performance: decode_s's operations with the terms that do not change along the run
        # computed once (the same values: ``p n + v n`` is the first sum of every step's flops)
        per_seq = self.params2 * n + self.vocab_hidden2 * n
        attn, kv, total = self.layers_hidden4, self.layers_kv4, self.params_total2
        compute, memory, overhead = self.compute, self.memory, self.overhead_s
        ends: list[float] = []
        durations: list[float] = []
        t = now
        # performance: the contexts as floats (``0.0 + c`` and ``kv * (c + n)`` convert the
        # integers c and c + n to these very floats; integers below 2**53 add exactly)
        c, cn, step = float(ctx), float(ctx + n), float(n)
        for _ in range(k_max):
            if stop_s <= t:
                break
            a = (per_seq + attn * c) / compute
            b = (total + kv * cn) / memory
            dt = overhead + (b if b > a else a)
            t += dt
            ends.append(t)
            durations.append(dt)
            c += step
            cn += step
        return ends, durations

    def decode_run_end(self, ctx: int, n: int, now: float, stop_s: float, k_max: int,
                       busy_s: float) -> tuple[int, float, float, float]:
        # performance: decode_run's loop without its lists (the same float operations)
        per_seq = self.params2 * n + self.vocab_hidden2 * n
        attn, kv, total = self.layers_hidden4, self.layers_kv4, self.params_total2
        compute, memory, overhead = self.compute, self.memory, self.overhead_s
        t = now
        dt = 0.0
        k = 0
        c, cn, step = float(ctx), float(ctx + n), float(n)
        while k < k_max and t < stop_s:
            a = (per_seq + attn * c) / compute
            b = (total + kv * cn) / memory
            dt = overhead + (b if b > a else a)
            t += dt
            busy_s += dt
            k += 1
            c += step
            cn += step
        return k, t, busy_s, dt

    def chunk_s(self, c: int, ctx: int, n: int, k: int = 0) -> float:
        flops = (self.params2 * (c + n) + self.vocab_hidden2 * (n + 1)
                 + self.layers_hidden4 * (0.0 + c * (k + c / 2) + ctx))
        nbytes = self.params_total2 + self.layers_kv4 * (ctx + k + c + n)
        a, b = flops / self.compute, nbytes / self.memory
        return self.overhead_s + (b if b > a else a)


class LinearCost(StepCost):
    def __init__(self, prefill_batch_s: float, prefill_token_s: float, prefill_attn_s: float,
                 decode_base_s: float, decode_seq_s: float, decode_ctx_s: float, overhead_s: float) -> None:
        self.prefill_batch_s = prefill_batch_s
        self.prefill_token_s = prefill_token_s
        self.prefill_attn_s = prefill_attn_s
        self.decode_base_s = decode_base_s
        self.decode_seq_s = decode_seq_s
        self.decode_ctx_s = decode_ctx_s
        self.overhead_s = overhead_s

    def step_s(self, prefill: list[tuple[int, int]], decode_contexts_sum: int, num_decode: int) -> float:
        n_prefill, attn, _ = _prefill_terms(prefill)
        t = 0.0
        if prefill:
            t += self.prefill_batch_s + self.prefill_token_s * n_prefill
            if self.prefill_attn_s:
                t += self.prefill_attn_s * attn
        if num_decode:
            t += self.decode_base_s + self.decode_seq_s * num_decode + self.decode_ctx_s * decode_contexts_sum
        return t + self.overhead_s

    def decode_s(self, ctx: int, n: int) -> float:
        t = 0.0
        if n:
            t += self.decode_base_s + self.decode_seq_s * n + self.decode_ctx_s * ctx
        return t + self.overhead_s

    def chunk_s(self, c: int, ctx: int, n: int, k: int = 0) -> float:
        t = 0.0
        t += self.prefill_batch_s + self.prefill_token_s * c
        if self.prefill_attn_s:
            t += self.prefill_attn_s * (0.0 + c * (k + c / 2))   # step_s's attention term
        if n:
            t += self.decode_base_s + self.decode_seq_s * n + self.decode_ctx_s * ctx
        return t + self.overhead_s
