"""``RealEngine``: the scheduler's Engine protocol on top of ``ModelRunner`` (wall-clock time).

One scheduler step = one ``ModelRunner.step``.  Per request the engine keeps the full token
list (prompt + generated); the scheduler's ``num_computed`` says where the KV ends, so every
piece of work is the uniform rule "feed ``tokens[num_computed : num_computed + n]`` at
``start_pos = num_computed``, sample when that reaches the end of the list" -- chunked
prefill, decode, recompute after preemption and resume after swap-in all follow from it.

Prompts: a request's ``payload`` (:class:`GenerationPayload`: real token ids, sampling,
stop conditions, a streaming callback) or, for trace replay, ``row.prompt_tokens`` ids drawn
(seeded by request id) from the vocabulary without special tokens.  Trace replay forces the
generated length to ``row.output_tokens`` (EOS ignored, as serving benchmarks do).

Invariants:
  * the runner's KV pool has the scheduler's geometry (:func:`make_real_setup`), and after
    every ``update_from_output`` the runner's free device blocks equal ``pool.num_free``;
  * ``execute`` never raises for a request-level problem: a runner error (``CacheFullError``,
    a context overflow, a state mismatch) FAILS the affected requests with a reason, and
    frees their KV, so nothing hangs or leaks; a step that raises is re-run without the
    request that caused it (:mod:`tokenfair.engine.step_isolation`), and NaN logits, a bad
    seed, a stop-string or streaming-callback error fail only their own request;
  * a request is reported finished exactly once, on the step that samples its last token.
"""

from __future__ import annotations

import time
import zlib
from typing import Mapping

import numpy as np

from ..core.reasons import Reason, ReasonCode
from ..core.request import Request
from ..sched.interface import SchedulerOutput, StepResult
from .kv_cache import CacheFullError
from .loader import LoadedModel
from .runner import ModelRunner, SeqWork
from .step_isolation import run_isolated
from .step_work import StepFailures, work_items
from .sampling import GREEDY
from .sequence import GenerationPayload, plain_vocab, EngineSeq

DEFAULT_KV_TOKENS = 16_384
DEFAULT_BLOCK_SIZE = 16

# Rough step-time model of SmolLM2-135M (fp32) on 2 CPU threads, from ``tokenfair calibrate``
# on the development machine; used only for the fair policy's estimates when no calibrated
# profile is given (the real run's times are measured, not modelled).
DEFAULT_CPU_LINEAR = dict(
    prefill_batch_s=0.018, prefill_token_s=0.00104, decode_base_s=0.0,
    decode_seq_s=0.00145, decode_ctx_s=1.09e-5, overhead_s=0.0465,
)

class RealEngine:
    """Implements ``add / execute / forget`` of the Engine protocol with a ``ModelRunner``."""

    def __init__(self, runner: ModelRunner, loaded: LoadedModel | None = None, *, seed: int = 0,
                 payloads: Mapping[str, GenerationPayload] | None = None,
                 keep_outputs: bool = False, keep_step_log: bool = True) -> None:
        self.runner = runner
        self.loaded = loaded
        self.config = runner.config
        self.seed = seed
        self.payloads = dict(payloads or {})
        self.keep_outputs = keep_outputs
        self.outputs: dict[str, list[int]] = {}     # request_id -> generated ids (keep_outputs)
        self._seqs: dict[str, EngineSeq] = {}
        self._on_host: set[str] = set()
        self._vocab: np.ndarray | None = None
        self.busy_s = 0.0
        self.swap_s = 0.0
        self.num_steps = 0
        self.num_failed = 0
        self.num_retried_steps = 0    # forward passes re-run to isolate a failing request
        self.num_failed_steps = 0     # consecutive steps in which every forward pass raised
        # per executed step: (prefill [(new, cached)], decode context sum, decode count, seconds, swap
        # seconds); kept only when ``keep_step_log`` (a bounded replay), never in a long-lived server
        self.keep_step_log = keep_step_log
        self.step_log: list[tuple[list[tuple[int, int]], int, int, float, float]] = []

    # ------------------------------------------------------------------ intake
    def add(self, req: Request, row=None) -> None:
        """Register ``req``; ``row`` (a TraceRow) gives the forced output length for replay."""
        payload = req.payload if isinstance(req.payload, GenerationPayload) else None
        if payload is None and row is not None and row.request_id in self.payloads:
            payload = req.payload = self.payloads[row.request_id]
        limits = [req.max_tokens]
        if row is not None:
            limits.append(row.output_tokens)
        if payload is not None:
            if len(payload.prompt_ids) != req.prompt_tokens:
                raise ValueError(f"{req.request_id}: payload has {len(payload.prompt_ids)} prompt ids, "
                                 f"request says prompt_tokens={req.prompt_tokens}")
            if payload.stop_strings and (self.loaded is None or self.loaded.tokenizer is None):
                raise ValueError(f"{req.request_id}: stop strings need a tokenizer")
            if payload.max_new_tokens is not None:
                limits.append(payload.max_new_tokens)
            stop = payload.stop_token_ids
            stop_ids = frozenset() if payload.ignore_eos else frozenset(
                self.config.eos_token_ids if stop is None else stop)
            st = EngineSeq(req, req.prompt_tokens, max(1, min(limits)), payload.sampling, stop_ids,
                      tuple(payload.stop_strings), payload, list(payload.prompt_ids))
        else:
            st = EngineSeq(req, req.prompt_tokens, max(1, min(limits)), GREEDY, frozenset(), (), None, None)
        if req.request_id in self._seqs and not self._seqs[req.request_id].done:
            raise ValueError(f"duplicate request id {req.request_id!r}")
        self._seqs[req.request_id] = st

    def synthetic_prompt(self, request_id: str, n: int) -> list[int]:
        """``n`` ids drawn from the non-special vocabulary, seeded by (seed, request id)."""
        if self._vocab is None:
            self._vocab = plain_vocab(self.loaded, self.config)
        rng = np.random.default_rng([self.seed, zlib.crc32(request_id.encode())])
        return rng.choice(self._vocab, size=n).tolist()

    # ----------------------------------------------------------------- one step
    def execute(self, out: SchedulerOutput) -> StepResult:
        t0 = time.perf_counter()
        prefill_shape = [(n, r.num_computed) for r, n in out.prefill]
        decode_ctx = sum(r.num_computed for r in out.decode)
        failures = StepFailures(lambda st, reason: self._finish(st, None, f"failed: {reason}"))
        self._sweep()
        for req in out.aborted:
            self.forget(req)
        swap_s = self._move_kv(out, failures)
        items = work_items(out, self._seqs, self.runner.cache, self.config.max_position, failures,
                           self.synthetic_prompt)
        finished = self._run_items(items, failures.fail) if items else []
        failed = failures.failed
        self.num_failed += len(failed)
        self.num_steps += 1
        dt = time.perf_counter() - t0
        if self.keep_step_log and not failed:   # the simulator's view of the step (see SimEngine.execute)
            self.step_log.append((prefill_shape, decode_ctx, len(out.decode), dt, swap_s))
        self.busy_s += dt
        self.swap_s += swap_s
        return StepResult(duration_s=dt, finished=finished, failed=failed, swap_s=swap_s)

    def _move_kv(self, out: SchedulerOutput, failures: StepFailures) -> float:
        """Evictions and swap-ins, evictions first (they free the blocks this step's work
        needs); a request swapped in and evicted again in the same step is evicted after its
        swap-in.  Returns the transfer seconds."""
        swap_s = 0.0
        swapped_in = {r.request_id for r in out.swapped_in}
        late = [(r, m) for r, m in out.preempted if r.request_id in swapped_in]
        for req, mode in out.preempted:
            if req.request_id not in swapped_in:
                swap_s += self._evict(req, mode)
        for req in out.swapped_in:
            st = self._seqs.get(req.request_id)
            if st is None:
                continue
            if st.kv_lost:
                failures.fail(st, Reason(ReasonCode.SWAP_IN, "KV lost (host pool was full at swap-out)"))
                continue
            try:
                swap_s += self.runner.swap_in(st.seq_id).seconds
                self._on_host.discard(st.seq_id)
            except (CacheFullError, KeyError) as err:
                failures.fail(st, Reason(ReasonCode.SWAP_IN, str(err)))
        for req, mode in late:
            swap_s += self._evict(req, mode)
        return swap_s

    def _run_items(self, items: list[tuple[EngineSeq, SeqWork]], fail) -> list[Request]:
        """Run the step's work (a request's own fault fails it alone, see
        :func:`run_isolated`), append the sampled tokens, stream them; return the finished."""
        step = run_isolated(self.runner, [w for _, w in items], engine_ok=self.num_failed_steps == 0)
        self.num_retried_steps += step.num_retries
        self.num_failed_steps = 0 if step.num_parts_ran else self.num_failed_steps + 1
        finished: list[Request] = []
        for st, work in items:
            why = step.failed.get(st.seq_id)
            if why is not None:
                fail(st, why)
                continue
            if not work.sample:
                continue
            token = step.sampled[st.seq_id]
            st.tokens.append(token)
            try:
                reason = self._stop_reason(st, token)
                if st.payload is not None:
                    st.payload.output_ids.append(token)
                if reason is None and st.payload is not None and st.payload.on_token is not None:
                    st.payload.on_token(token, None)
            except Exception as err:  # noqa: BLE001 - a stop-string/tokenizer/callback error is the request's
                fail(st, Reason(ReasonCode.REQUEST_ERROR, f"{type(err).__name__}: {err}"))
                continue
            if reason is not None:
                finished.append(st.req)
                self._finish(st, token, reason)
        return finished

    def _evict(self, req: Request, mode: str) -> float:
        st = self._seqs.get(req.request_id)
        if st is None:
            return 0.0
        cache = self.runner.cache
        if mode == "swap":
            if not cache.has_seq(st.seq_id):
                # nothing computed yet on the device (e.g. admitted and evicted in one step)
                if req.num_computed:
                    st.kv_lost = True
                return 0.0
            try:
                seconds = self.runner.swap_out(st.seq_id).seconds
                self._on_host.add(st.seq_id)
                return seconds
            except CacheFullError:
                self.runner.recompute(st.seq_id)
                st.kv_lost = True
                return 0.0
        self.runner.recompute(st.seq_id)         # frees device and host copies alike
        self._on_host.discard(st.seq_id)
        st.kv_lost = False
        return 0.0

    def _stop_reason(self, st: EngineSeq, token: int) -> str | None:
        if st.num_generated >= st.target:
            return "length"
        if token in st.stop_ids:
            return "stop"
        if st.stop_strings:
            longest = max(len(s) for s in st.stop_strings)
            tail = st.tokens[max(st.num_prompt, len(st.tokens) - longest - 8):]
            text = self.loaded.decode(tail, skip_special_tokens=False)
            if any(s in text for s in st.stop_strings):
                return "stop"
        return None

    def _finish(self, st: EngineSeq, token: int | None, reason: str) -> None:
        if st.done:
            return
        st.done = True
        self.runner.free(st.seq_id)
        self._on_host.discard(st.seq_id)
        if self.keep_outputs and st.tokens is not None:
            self.outputs[st.seq_id] = st.tokens[st.num_prompt:]
        del self._seqs[st.seq_id]
        if st.payload is not None:
            st.payload.finish_reason = reason
            if st.payload.on_token is not None:
                try:
                    st.payload.on_token(token, reason)
                except Exception:  # noqa: BLE001 - the request has ended; its callback's error is its own
                    pass

    def _sweep(self) -> None:
        """Free host KV of requests the scheduler ended without telling the engine
        (``fail_waiting``, aborts); device KV is only ever held by running requests."""
        if self.num_steps % 256 == 255:          # states of requests rejected after add()
            for st in [s for s in self._seqs.values() if s.req.status.is_terminal]:
                self._finish(st, None, f"{st.req.status.value}: {st.req.reason}")
        for seq_id in list(self._on_host):
            st = self._seqs.get(seq_id)
            if st is None or st.req.status.is_terminal:
                self._on_host.discard(seq_id)
                self.runner.free(seq_id)
                if st is not None:
                    self._finish(st, None, f"{st.req.status.value}: {st.req.reason}")

    def forget(self, req: Request) -> None:
        """The scheduler ended ``req`` (expired, aborted): free its KV and state."""
        st = self._seqs.get(req.request_id)
        if st is None or st.req is not req:
            return
        self._finish(st, None, f"{req.status.value}: {req.reason}" if req.status.is_terminal else "aborted")

    def close(self) -> None:
        """Forget every request still held (end of a run)."""
        for st in list(self._seqs.values()):
            self._finish(st, None, "engine_closed")

    # ------------------------------------------------------------ diagnostics
    def output_ids(self, request_id: str) -> list[int] | None:
        st = self._seqs.get(request_id)
        if st is not None:
            return None if st.tokens is None else st.tokens[st.num_prompt:]
        return self.outputs.get(request_id)

    def check_blocks(self, pool) -> None:
        """Assert the runner's device blocks match the scheduler's ``BlockPool``."""
        cache = self.runner.cache
        assert cache.num_blocks == pool.num_blocks, (cache.num_blocks, pool.num_blocks)
        assert cache.num_free_blocks == pool.num_free, (cache.num_free_blocks, pool.num_free)

    @property
    def num_active(self) -> int:
        return len(self._seqs)
