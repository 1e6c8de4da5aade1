"""The protocols in ``sched/interface.py`` are the ones the engines and the scheduler
implement: every protocol method exists on each implementation with the same parameter
names (compiled or interpreted)."""

import inspect

import pytest

from tokenfair.sched.interface import Engine, Scheduler
from tokenfair.sched.scheduler import IterationScheduler
from tokenfair.sim.engine import RowFedEngine


def _protocol_methods(proto) -> list[str]:
    return [n for n, v in vars(proto).items() if callable(v) and not n.startswith("_")]


def _param_names(fn) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]


def _assert_implements(cls, proto):
    methods = _protocol_methods(proto)
    assert methods, proto
    for name in methods:
        assert hasattr(cls, name), f"{cls.__name__} lacks {proto.__name__}.{name}"
        assert _param_names(getattr(cls, name)) == _param_names(getattr(proto, name)), (cls, name)


def test_the_simulated_engine_implements_the_engine_protocol():
    _assert_implements(RowFedEngine, Engine)
    assert _protocol_methods(Engine) == ["add", "execute", "forget"]


def test_the_pytorch_engine_implements_the_engine_protocol():
    pytest.importorskip("torch")
    from tokenfair.engine.real_engine import RealEngine
    _assert_implements(RealEngine, Engine)


def test_the_iteration_scheduler_implements_the_scheduler_protocol():
    _assert_implements(IterationScheduler, Scheduler)
    assert "reject" in _protocol_methods(Scheduler)
