"""``PartialState``/``AcceleratorState`` behave as Accelerate's shared-state classes (CPU, one process).

Each check runs once with ``accelerate`` itself (the oracle, when installed) and once with ``trainkit``, through
the same code: ``accelerator.state`` is an ``AcceleratorState``; instances of a class share their attributes;
``_reset_state()`` empties the state so that stored attributes raise Accelerate's explanation while methods keep
working, and a new ``Accelerator()`` brings the state back.
"""

from __future__ import annotations

import importlib
import importlib.util
import pickle
from types import SimpleNamespace

import pytest

LIBRARIES = ["trainkit", *(["accelerate"] if importlib.util.find_spec("accelerate") else [])]


@pytest.fixture(params=LIBRARIES)
def lib(request):
    """The library's ``Accelerator`` and state classes; the state is reset before and after."""
    state = importlib.import_module(f"{request.param}.state")
    names = SimpleNamespace(Accelerator=importlib.import_module(request.param).Accelerator, name=request.param,
                            PartialState=state.PartialState, AcceleratorState=state.AcceleratorState,
                            is_initialized=state.is_initialized)
    state.AcceleratorState._reset_state(reset_partial_state=True)
    yield names
    state.AcceleratorState._reset_state(reset_partial_state=True)


def test_accelerator_state_is_an_accelerator_state_shared_by_every_instance(lib):
    accelerator = lib.Accelerator(cpu=True)
    assert type(accelerator.state) is lib.AcceleratorState and lib.is_initialized()
    other = lib.AcceleratorState()
    other.some_setting = "shared"
    assert accelerator.state.some_setting == "shared"  # one attribute dictionary for the class
    assert lib.PartialState().num_processes == accelerator.state.num_processes == 1
    assert not isinstance(accelerator.state, lib.PartialState)  # two classes, as in Accelerate
    with pytest.raises(AttributeError, match="'AcceleratorState' object has no attribute 'unknown'"):
        accelerator.state.unknown
    assert repr(accelerator.state).splitlines()[1:5] == ["Num processes: 1", "Process index: 0",
                                                         "Local process index: 0", "Device: cpu"]
    assert "Mixed precision type: no" in repr(accelerator.state)


def test_reset_accelerator_state_explains_stored_attributes_and_keeps_methods(lib):
    accelerator = lib.Accelerator(cpu=True)
    accelerator.state._reset_state()
    assert not lib.is_initialized()
    with pytest.raises(AttributeError) as raised:
        accelerator.num_processes
    assert "`AcceleratorState` object has no attribute `num_processes`" in str(raised.value)
    assert "This happens if `AcceleratorState._reset_state()`" in str(raised.value)
    assert accelerator.state.is_main_process  # a method/property of the class, answered by the process state
    accelerator.state.wait_for_everyone()
    lib.Accelerator(cpu=True)  # a new Accelerator sets the state up again: the old one works again too
    assert accelerator.num_processes == 1 and lib.is_initialized()


def test_reset_partial_state_explains_and_a_new_state_answers_again(lib):
    state = lib.PartialState(cpu=True)
    assert state.num_processes == 1 and state.initialized
    state._reset_state()
    assert not state.initialized
    with pytest.raises(AttributeError) as raised:
        state.num_processes
    assert "`PartialState` object has no attribute `num_processes`" in str(raised.value)
    assert "This happens if `PartialState._reset_state()`" in str(raised.value)
    assert lib.PartialState(cpu=True).num_processes == 1 and state.num_processes == 1  # shared again


def test_distributed_type_set_on_the_state_is_what_everyone_reads(lib):
    accelerator = lib.Accelerator(cpu=True)
    distributed_type = type(accelerator.distributed_type)
    lib.AcceleratorState().distributed_type = distributed_type.MULTI_CPU
    assert accelerator.state.distributed_type == distributed_type.MULTI_CPU
    assert accelerator.distributed_type == distributed_type.MULTI_CPU


def test_a_state_pickles_to_the_state_of_the_process_that_loads_it(lib):
    accelerator = lib.Accelerator(cpu=True)
    restored = pickle.loads(pickle.dumps(accelerator.state))
    assert type(restored) is lib.AcceleratorState and restored.num_processes == 1
    if lib.name == "trainkit":  # trainkit's view shares the live dictionary; Accelerate's copy carries values
        assert restored.__dict__ is accelerator.state.__dict__


def test_mixed_precision_of_a_made_state_cannot_change(lib):
    accelerator = lib.Accelerator(cpu=True, mixed_precision="bf16")
    with pytest.raises(ValueError):
        lib.AcceleratorState(mixed_precision="fp16")
    assert lib.AcceleratorState(mixed_precision="bf16").mixed_precision == accelerator.mixed_precision == "bf16"
