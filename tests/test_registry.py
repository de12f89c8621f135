"""nesgpu.registry: one registry for strategies, tasks, noise kinds and module forms. A component is checked when
registered, a taken name is refused unless replaced on purpose, an unknown name is an error naming the
registered ones, and a newly registered noise kind trains as a built-in one does."""

import dataclasses

import pytest
import torch

import nesgpu
from nesgpu.kinds import KINDS, Gaussian, Kind
from nesgpu.layers import FORMS
from nesgpu.registry import Registry, instance_of, subclass_of
from nesgpu.strategies import STRATEGIES, Strategy
from nesgpu.tasks import TASKS, TaskSpec
from nesgpu.train import TrainConfig, train


def numbers() -> Registry:
    return Registry("number", instance_of(int), "an int", options=lambda n: type(n), entries=[("one", 1)])


def test_register_lookup_and_order():
    r = numbers()
    assert r.register("two", 2) == 2 and list(r) == ["one", "two"] and len(r) == 2 and r["two"] == 2
    assert r.lookup("one") == 1 and r.options("one") is int and r.options_by_name() == {"one": int, "two": int}
    assert "two" in r and r.get("three") is None and dict(r.items()) == {"one": 1, "two": 2}
    with pytest.raises(ValueError, match=r"unknown number 'three'; expected one of \['one', 'two'\]"):
        r.lookup("three")
    with pytest.raises(KeyError):  # a mapping's own protocol stays a mapping's
        r["three"]


def test_bad_registrations_are_refused():
    r = numbers()
    with pytest.raises(TypeError, match=r"a number must be an int; got '2' \(str\)"):
        r.register("two", "2")
    with pytest.raises(TypeError, match="a number's name must be a non-empty string; got ''"):
        r.register("", 2)
    with pytest.raises(ValueError, match=r"a number named 'one' is registered already \(1\).*replace=True"):
        r.register("one", 1)
    with pytest.raises(TypeError, match="must be an int"):
        r["two"] = "2"  # a dict-style assignment is checked too
    assert list(r) == ["one"]


def test_replacing_on_purpose_and_monkeypatch(monkeypatch):
    r = numbers()
    r.register("one", 11, replace=True)
    assert r["one"] == 11
    monkeypatch.setitem(r, "two", 2)
    assert r["two"] == 2
    monkeypatch.undo()
    assert list(r) == ["one"]


def test_a_component_is_registered_under_its_own_name():
    class Misnamed(Gaussian):
        name = "other"

    with pytest.raises(ValueError, match="registered under its own name: .* names itself 'other', not 'mine'"):
        KINDS.register("mine", Misnamed)
    assert "mine" not in KINDS


def test_the_library_registries_hold_what_they_take():
    assert all(isinstance(c, type) and issubclass(c, Strategy) for c in STRATEGIES.values())
    assert all(isinstance(spec, TaskSpec) for spec in TASKS.values())
    assert all(issubclass(c, Kind) and c.name == name for name, c in KINDS.items())
    assert all(dataclasses.is_dataclass(options) for options in STRATEGIES.options_by_name().values())
    assert KINDS.options("lowrank") is KINDS["lowrank"]  # a kind is its own options dataclass
    assert len(FORMS) == 0  # forms of your own only: transformers' types are built in
    assert subclass_of(Strategy)(STRATEGIES["ars"]) and not subclass_of(Strategy)(STRATEGIES["ars"](4))


@dataclasses.dataclass(frozen=True)
class Doubled(Gaussian):
    """A noise kind of one's own (one file plus one registration): Gaussian under another name."""

    name = "doubled"


def test_a_registered_noise_kind_converts_and_trains(monkeypatch, tmp_path):
    monkeypatch.setitem(KINDS, "doubled", Doubled)
    net = nesgpu.convert(torch.nn.Sequential(torch.nn.Linear(3, 2)), "doubled")
    assert isinstance(net[0], nesgpu.layers.PerturbedLinear)
    config = TrainConfig(task="digits", layer="doubled", steps=2, population=8, out=str(tmp_path / "run"))
    result = train(config, log=lambda *a, **k: None)
    assert result["steps"] == 2 and result["layer"] == "doubled"
