"""The plugin's settings: which contract, step-cost profile and policy it runs.

Read from vLLM's ``--additional-config`` JSON (keys ``tokenfair_contract``,
``tokenfair_profile``, ``tokenfair_policy``, ``tokenfair_records``, ``tokenfair_steps``) or,
for each key not given there, the environment (``TOKENFAIR_CONTRACT``, ``TOKENFAIR_PROFILE``,
``TOKENFAIR_POLICY``, ``TOKENFAIR_RECORDS``, ``TOKENFAIR_STEPS``).  The
contract is required: a scheduler that silently ran without one would not be the contract's.

The contract's engine budgets describe tokenfair's own engine; inside vLLM they are vLLM's:
``max_running`` becomes ``--max-num-seqs``, ``prefill_token_budget`` the step's token budget
(``--max-num-batched-tokens``) and ``chunk_size`` at most that (and at most
``--long-prefill-token-threshold`` when set).  The profile (step-time model) predicts step
times for the TPOT-shaped prefill budget; the default is a linear fit of SmolLM2-135M on
vLLM's CPU backend (rough, see below); give one fitted to your engine with
``tokenfair_profile``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ...contracts.contract import Contract, ContractError, load_contract
from ...core.costmodel import Profile, load_profile

CONTRACT_KEY, PROFILE_KEY, POLICY_KEY = "tokenfair_contract", "tokenfair_profile", "tokenfair_policy"
RECORDS_KEY, STEPS_KEY = "tokenfair_records", "tokenfair_steps"
ENV = {CONTRACT_KEY: "TOKENFAIR_CONTRACT", PROFILE_KEY: "TOKENFAIR_PROFILE", POLICY_KEY: "TOKENFAIR_POLICY",
       RECORDS_KEY: "TOKENFAIR_RECORDS", STEPS_KEY: "TOKENFAIR_STEPS"}
DEFAULT_POLICY = "fair"
# SmolLM2-135M, bfloat16, vLLM 0.32 CPU backend, 2 idle cores (--enforce-eager): decode
# steps from the throughput seen at 1 and 16 streams (about 32 and 270 tok/s), the prefill
# cost a rough estimate -- not a fit; block size and KV capacity are replaced by vLLM's own.
VLLM_CPU_SMOLLM2 = Profile(name="vllm-cpu-smollm2-135m", kind="linear", prefill_batch_s=0.02,
                           prefill_token_s=0.0006, decode_base_s=0.028, decode_seq_s=0.002,
                           decode_ctx_s=1.0e-6, overhead_s=0.0, kv_capacity_tokens=65_536, block_size=16,
                           swap_capacity_tokens=0)


class SettingsError(ValueError):
    """Bad plugin settings; the message names the key and the fix."""


@dataclass(frozen=True)
class Settings:
    contract: Contract           # engine budgets already replaced by vLLM's (engine_budgets)
    profile: Profile             # block size and KV capacity are vLLM's
    policy: str                  # a tokenfair policy spec, e.g. "fair" or "fair:order=fifo"
    contract_path: str           # where the contract came from (for logs)
    records_path: str | None = None   # append one JSON line per ended request here (None: off)
    steps_path: str | None = None     # append one JSON line per step here (steplog.py; None: off)


def _value(additional: dict, key: str) -> str | None:
    v = additional.get(key)
    if v is None:
        v = os.environ.get(ENV[key])
    if v is not None and not isinstance(v, str):
        raise SettingsError(f"--additional-config {key}: expected a string, got {type(v).__name__}")
    return v or None


def engine_budgets(contract: Contract, max_running: int, token_budget: int, chunk_cap: int) -> Contract:
    """``contract`` with its engine budgets set to vLLM's (see the module docstring)."""
    eng = contract.engine
    chunk = min(eng.chunk_size, token_budget, chunk_cap if chunk_cap > 0 else token_budget)
    engine = eng.model_copy(update={"max_running": max_running, "prefill_token_budget": token_budget,
                                    "chunk_size": chunk})
    return contract.model_copy(update={"engine": engine})


def load_settings(additional: dict | None, *, max_running: int, token_budget: int, chunk_cap: int,
                  num_blocks: int, block_size: int) -> Settings:
    additional = dict(additional or {})
    path = _value(additional, CONTRACT_KEY)
    if path is None:
        raise SettingsError(f"tokenfair scheduler: no contract; start vLLM with --additional-config "
                            f"'{{\"{CONTRACT_KEY}\": \"PATH\"}}' or set {ENV[CONTRACT_KEY]}=PATH")
    try:
        contract = load_contract(path)
    except (ContractError, OSError) as err:
        raise SettingsError(f"tokenfair scheduler: contract {path}: {err}") from err
    prof_name = _value(additional, PROFILE_KEY)
    try:
        profile = VLLM_CPU_SMOLLM2 if prof_name is None else load_profile(prof_name)
    except ValueError as err:
        raise SettingsError(f"tokenfair scheduler: {PROFILE_KEY}: {err}") from err
    profile = profile.model_copy(update={"block_size": block_size, "kv_capacity_tokens": num_blocks * block_size,
                                         "swap_capacity_tokens": 0})
    policy = _value(additional, POLICY_KEY) or DEFAULT_POLICY
    return Settings(engine_budgets(contract, max_running, token_budget, chunk_cap), profile, policy, path,
                    _value(additional, RECORDS_KEY), _value(additional, STEPS_KEY))
