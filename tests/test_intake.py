"""``runtime/intake.py``: a row's request takes its class terms from the contract; the
per-run ``Intake`` reads them once per (tenant, requested class) and gives the same request
as reading the contract for each row."""

from tokenfair.contracts.contract import parse_contract
from tokenfair.core.reasons import ReasonCode
from tokenfair.runtime.intake import Intake
from tokenfair.workloads.workload import TraceRow

CONTRACT = parse_contract({
    "version": "v-1",
    "tenants": {"acme": {"weight": 2, "classes": ["interactive"]}},
    "classes": {"interactive": {"priority": 10, "max_wait_s": 30, "ttft_slo_s": 2.0, "tpot_slo_s": 0.1},
                "batch": {"priority": 0, "aging_rate": 0.5, "deadline_s": 600, "preemptible": False}},
    "default_class": "interactive",
})


def _direct(row: TraceRow) -> dict:
    """The request's class terms read from the contract for this row alone."""
    klass = CONTRACT.class_for(row.tenant, row.klass)
    allowed = klass is not None
    klass = klass or row.klass or CONTRACT.default_class
    spec = CONTRACT.classes.get(klass) or CONTRACT.classes[CONTRACT.default_class]
    deadline = None
    if spec.deadline_s is not None:
        deadline = row.arrival_s + (spec.deadline_s if row.deadline_s is None else max(spec.deadline_s, row.deadline_s))
    elif row.deadline_s is not None:
        deadline = row.arrival_s + row.deadline_s
    return {"klass": klass, "allowed": allowed, "deadline_s": deadline,
            "priority": spec.priority if row.priority is None else min(spec.priority, row.priority),
            "aging_rate": spec.aging_rate, "max_wait_s": spec.max_wait_s, "preemptible": spec.preemptible,
            "ttft_slo_s": spec.ttft_slo_s, "tpot_slo_s": spec.tpot_slo_s}


ROWS = [TraceRow(f"r{i}", float(i), tenant, 100, 10, klass, deadline, priority)
        for i, (tenant, klass, deadline, priority) in enumerate([
            ("acme", None, None, None), ("acme", "interactive", None, 50.0), ("acme", "batch", None, None),
            ("other", "batch", 900.0, None), ("other", "batch", 60.0, -1.0), ("other", None, 5.0, None),
            ("other", "interactive", None, None), ("acme", "interactive", None, 3.0), ("other", "nope", None, None),
        ])]


def test_each_request_equals_reading_the_contract():
    intake = Intake(CONTRACT)
    for seq, row in enumerate(ROWS):
        req, reject = intake.make(row, seq)
        want = _direct(row)
        assert (reject is None) == want["allowed"], row
        if reject is not None:
            assert reject.code is ReasonCode.CLASS_NOT_ALLOWED
        got = {"klass": req.klass, "allowed": reject is None, "deadline_s": req.deadline_s,
               "priority": req.priority, "aging_rate": req.aging_rate, "max_wait_s": req.max_wait_s,
               "preemptible": req.preemptible, "ttft_slo_s": req.ttft_slo_s, "tpot_slo_s": req.tpot_slo_s}
        assert got == want, row
        assert (req.seq, req.tenant, req.arrival_s, req.prompt_tokens) == (seq, row.tenant, row.arrival_s, 100)


def test_terms_are_read_once_per_tenant_and_requested_class():
    intake = Intake(CONTRACT)
    for seq, row in enumerate(ROWS * 50):
        intake.make(row, seq)
    assert len(intake.terms) == len({(r.tenant, r.klass) for r in ROWS})
