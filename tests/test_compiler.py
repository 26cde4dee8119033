"""Compiler profiles: the XLA passes the cost model follows, per backend (cost/_compiler.py)."""

import dataclasses

import pytest

import toast_lab as tl
from toast_lab.cost import CompilerProfile, CostModel, compiler_profile
from toast_lab.cost import _compiler
from toast_lab.plan._hardware import PLATFORMS

BEHAVIOURS = [f.name for f in dataclasses.fields(CompilerProfile) if f.name != "platform"]


def test_every_platform_has_a_profile_read_by_device_or_name():
    for platform in PLATFORMS:
        assert compiler_profile(platform).platform == platform
    for name, spec in tl.devices().items():
        assert compiler_profile(spec) is compiler_profile(spec.platform), name
    assert compiler_profile(" TPU ") is compiler_profile("tpu")
    with pytest.raises(dataclasses.FrozenInstanceError):
        compiler_profile("gpu").fuses_attention = True
    with pytest.raises(TypeError):
        _compiler.PROFILES["npu"] = compiler_profile("gpu")  # read-only


def test_profiles_say_what_each_backend_does():
    cpu, gpu, tpu = (compiler_profile(p) for p in ("cpu", "gpu", "tpu"))
    # partial sums are added before one all-reduce on GPUs and TPUs, not on XLA:CPU
    assert gpu.reassociates_all_reduce and tpu.reassociates_all_reduce
    assert not cpu.reassociates_all_reduce
    # XLA's attention runs as a flash kernel on TPUs only
    assert (cpu.fuses_attention, gpu.fuses_attention, tpu.fuses_attention) == (
        False, False, True)
    # the GPU and TPU pipelines agree on everything but attention
    assert dataclasses.replace(gpu, platform="tpu", fuses_attention=True) == tpu
    assert all(getattr(cpu, b) != getattr(gpu, b) for b in BEHAVIOURS if b != "fuses_attention")


def test_unknown_platform_or_type_is_an_error_naming_the_choices():
    with pytest.raises(ValueError, match="'npu'.*cpu, gpu, tpu"):
        compiler_profile("npu")
    with pytest.raises(TypeError, match="DeviceSpec or a platform name"):
        compiler_profile(tl.Mesh({"data": 2}, device="cpu"))


def test_the_device_carries_no_compiler_behaviour():
    spec = tl.get_device("cpu")
    assert [b for b in BEHAVIOURS if hasattr(spec, b)] == []


def test_the_cost_model_follows_the_profile_not_the_device(monkeypatch):
    """A CPU whose profile is XLA:GPU's is estimated as that CPU compiled by XLA:GPU."""
    fn, args = tl.zoo.get("gpt")
    an = tl.analyze(tl.trace(fn, *args))
    plan = tl.Plan.replicated(an).with_axes("batch", ("data", "model"))
    cpu = tl.get_device("cpu")
    axes = {"data": 4, "model": 2}
    on_cpu = CostModel(an, tl.Mesh(axes, device=cpu))
    assert on_cpu.compiler is compiler_profile("cpu")
    as_gpu = CostModel(an, tl.Mesh(axes, device=dataclasses.replace(cpu, platform="gpu")))
    assert as_gpu.compiler is compiler_profile("gpu")
    monkeypatch.setattr(_compiler, "PROFILES", {"cpu": compiler_profile("gpu")})
    patched = CostModel(an, tl.Mesh(axes, device=cpu))
    assert patched.estimate(plan) == as_gpu.estimate(plan)
    assert patched.estimate(plan) != on_cpu.estimate(plan)
