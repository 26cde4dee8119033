"""Mesh and hardware presets (DESIGN.md §4)."""

import dataclasses
import json
import pickle
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from toast_lab import DeviceSpec, Link, devices, get_device
from toast_lab import Mesh
from toast_lab.plan._hardware import device_numbers

PRESETS = [
    "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "a100-80gb", "h100-80gb", "h100-96gb", "h200",
    "b200", "cpu"
]


# --- presets ----------------------------------------------------------------------------


def test_every_preset_is_listed_with_aliases():
    table = devices()
    assert set(PRESETS) | {"h100", "a100"} == set(table)
    assert table["h100"] is table["h100-80gb"]
    assert table["a100"] is table["a100-80gb"]
    with pytest.raises(TypeError):
        table["mine"] = table["cpu"]  # read-only


@pytest.mark.parametrize("name", PRESETS)
def test_presets_are_plausible(name):
    spec = get_device(name)
    assert spec.name == name
    for dtype in ("bfloat16", "float16", "float32"):
        assert spec.peak_flops[dtype] > 0
    assert spec.peak_flops["float32"] <= spec.peak_flops["bfloat16"]
    assert spec.intra_node.bandwidth >= spec.inter_node.bandwidth
    assert spec.intra_node.latency <= spec.inter_node.latency
    assert "issue #" not in spec.source  # where the figures come from, not a tracker
    assert spec.memory_bytes >= 2**30 and spec.memory_bandwidth > 1e9
    assert spec.devices_per_node >= 1
    assert spec.source
    assert name in repr(spec)


def test_datasheet_numbers():
    h100 = get_device("h100")
    assert h100.peak_flops["bfloat16"] == 989e12  # dense, not 2:4 sparse
    assert h100.peak_flops["float8"] == 1979e12
    assert h100.memory_bytes == 80 * 2**30
    assert h100.intra_node.bandwidth == 450e9  # NVLink 900 GB/s bidirectional
    assert h100.inter_node.bandwidth == 50e9  # 400 Gb/s NIC per GPU
    assert h100.devices_per_node == 8
    v5e = get_device("tpu-v5e")
    assert v5e.peak_flops["bfloat16"] == 197e12
    assert v5e.peak_flops["int8"] == 394e12
    assert v5e.devices_per_node == 256
    assert get_device("tpu-v4").devices_per_node == 4096
    assert get_device("b200").peak_flops["bfloat16"] == 2.25e15


def test_interconnect_and_efficiency_figures_follow_their_sources():
    # ICI per axis: a bidirectional ring over one torus dimension, two links of the one-way
    # rate in "How to Scale Your Model" (v4p 4.5e10, v5p 9e10, v5e 4.5e10, v6e 9e10 B/s).
    for name, one_way in (("tpu-v4", 4.5e10), ("tpu-v5p", 9e10), ("tpu-v5e", 4.5e10),
                          ("tpu-v6e", 9e10)):
        assert get_device(name).intra_node.bandwidth == 2 * one_way, name
    # DCN: about 2.5e10 B/s per host, shared by its 8 (v5e, v6e) or 4 (v4, v5p) chips.
    assert get_device("tpu-v6e").inter_node.bandwidth == pytest.approx(3.125e9)
    assert get_device("tpu-v5p").inter_node.bandwidth == pytest.approx(6.25e9)
    assert get_device("tpu-v5p").torus_dims == 3 and get_device("tpu-v6e").torus_dims == 2
    assert get_device("tpu-v6e").efficiency.tile == (8, 256, 256)  # 256x256 MXU
    h96 = get_device("h100-96gb")
    assert h96.memory_bytes == 96 * 2**30 and h96.memory_bandwidth == 2.4e12
    assert h96.peak_flops == get_device("h100").peak_flops
    h100 = get_device("h100").efficiency
    # measured on an H100 (plan/_hardware.py [H100-MEASURED]), the A100 from [MAMF]
    assert (h100.matmul, h100.attention, h100.memory) == (0.78, 0.48, 0.73)
    assert h100.units == 132 and get_device("h200").efficiency == h100
    assert get_device("a100").efficiency.matmul == pytest.approx(267.9 / 312, abs=1e-3)
    assert get_device("h100").torus_dims == 0  # NVLink is switched
    with pytest.raises(ValueError, match="fraction"):
        dataclasses.replace(h100, matmul=1.5)


def test_every_preset_keeps_its_recorded_figures():
    """Every figure of every preset (all a plan file records of a device) as
    tests/data/device_presets.json has it: a change to how presets are built moves none."""
    recorded = json.loads((Path(__file__).parent / "data" / "device_presets.json").read_text())
    assert sorted(recorded) == sorted(PRESETS)
    for name in PRESETS:
        assert device_numbers(get_device(name)) == recorded[name], name


def test_hopper_variants_are_the_h100_with_their_own_memory():
    h100 = get_device("h100-80gb")
    for name in ("h100-96gb", "h200"):
        spec = get_device(name)
        assert dataclasses.replace(spec, name=h100.name, memory_bytes=h100.memory_bytes,
                                   memory_bandwidth=h100.memory_bandwidth,
                                   source=h100.source) == h100
        assert spec.memory_bytes > h100.memory_bytes
        # each source says where its own numbers come from, then the H100's notes
        assert spec.source.endswith(h100.source[h100.source.index(" float32 is"):])


def test_get_device_by_name_or_spec():
    assert get_device("H100") is get_device("h100-80gb")
    assert get_device(" tpu-v5e ") is devices()["tpu-v5e"]
    spec = get_device("cpu")
    assert get_device(spec) is spec
    with pytest.raises(ValueError, match="Unknown device 'v100'.*h100-80gb.*tpu-v5e"):
        get_device("v100")
    with pytest.raises(ValueError, match="Unknown device"):
        get_device(3)


def test_peak_flops_for_dtypes():
    h100 = get_device("h100")
    assert h100.peak_flops_for(jnp.bfloat16) == 989e12
    assert h100.peak_flops_for(np.dtype("float32")) == 67e12
    assert h100.peak_flops_for("bf16") == h100.peak_flops_for("BFLOAT16") == 989e12
    assert h100.peak_flops_for(jnp.float8_e4m3fn) == 1979e12
    assert h100.peak_flops_for("f8e5m2") == 1979e12  # HLO spelling
    assert h100.peak_flops_for("tf32") == 494.5e12
    assert h100.peak_flops_for(jnp.int32) == h100.peak_flops["float32"]  # vector units
    assert h100.peak_flops_for(jnp.complex64) == h100.peak_flops["float32"]
    v5e = get_device("tpu-v5e")
    assert v5e.peak_flops_for(jnp.float16) == v5e.peak_flops["bfloat16"]
    assert v5e.peak_flops_for(jnp.float32) == pytest.approx(197e12 / 3)
    assert v5e.peak_flops_for(jnp.float8_e4m3fn) == v5e.peak_flops["int8"]  # no fp8 on v5e
    assert get_device("tpu-v4").peak_flops_for("float8_e5m2") == 275e12
    assert get_device("cpu").peak_flops_for(jnp.int8) == get_device("cpu").peak_flops["bfloat16"]
    with pytest.raises(ValueError, match="tpu-v5e has no peak flops for dtype 'float64'"):
        v5e.peak_flops_for(np.float64)
    with pytest.raises(TypeError, match="Cannot read a dtype"):
        v5e.peak_flops_for(object())


def test_custom_device_spec_and_replace():
    mine = DeviceSpec(
        name="my-chip",
        peak_flops={"bf16": 100e12, "float16": 100e12, "float32": 10e12},
        memory_bytes=24 * 2**30,
        memory_bandwidth=1e12,
        intra_node=Link(100e9, 1e-6),
        inter_node=Link(10e9, 1e-5),
        devices_per_node=4,
        source="made up",
    )
    assert mine.peak_flops["bfloat16"] == 100e12  # names are canonicalized
    with pytest.raises(TypeError):
        mine.peak_flops["bfloat16"] = 1.0
    bigger = dataclasses.replace(get_device("h100"), memory_bytes=96 * 2**30)
    assert bigger.memory_bytes == 96 * 2**30 and bigger.name == "h100-80gb"
    assert get_device("h100").memory_bytes == 80 * 2**30  # the preset is untouched
    assert hash(bigger) != hash(get_device("h100"))
    assert pickle.loads(pickle.dumps(get_device("h100"))) == get_device("h100")
    mesh = Mesh({"data": 4}, device=bigger, links={"data": Link(1e9, 1e-6)})
    assert pickle.loads(pickle.dumps(mesh)) == mesh


def test_device_spec_validation():
    base = get_device("cpu")
    with pytest.raises(ValueError, match="needs peak_flops for float16"):
        dataclasses.replace(base, peak_flops={"bfloat16": 1.0, "float32": 1.0})
    with pytest.raises(ValueError, match="must be positive"):
        dataclasses.replace(base, peak_flops={**base.peak_flops, "float32": 0.0})
    with pytest.raises(ValueError, match="memory_bytes"):
        dataclasses.replace(base, memory_bytes=0)
    with pytest.raises(ValueError, match="devices_per_node"):
        dataclasses.replace(base, devices_per_node=0)
    with pytest.raises(ValueError, match="bandwidth must be positive"):
        Link(0.0, 1e-6)
    with pytest.raises(ValueError, match="latency"):
        Link(1e9, -1.0)


# --- mesh -------------------------------------------------------------------------------


def test_mesh_shape():
    mesh = Mesh({"data": 4, "model": 2}, device="h100")
    assert mesh.axes == (("data", 4), ("model", 2))
    assert mesh.axis_names == ("data", "model")
    assert mesh.shape == {"data": 4, "model": 2}
    assert list(mesh.shape) == ["data", "model"]
    assert mesh.size == 8
    assert mesh.axis_size("model") == 2
    assert mesh.axis_stride("data") == 2 and mesh.axis_stride("model") == 1
    assert mesh.device is get_device("h100-80gb")
    assert repr(mesh) == "Mesh(data=4, model=2, device='h100-80gb')"
    assert Mesh([("data", 4), ("model", 2)], device="h100") == mesh
    assert hash(Mesh({"data": 4, "model": 2}, device="h100")) == hash(mesh)
    assert Mesh({"data": 8}).device.name == "cpu"
    with pytest.raises(KeyError, match="no axis 'seq'"):
        mesh.axis_size("seq")


def test_mesh_is_frozen_and_replaceable():
    mesh = Mesh({"data": 4, "model": 2}, device="h100")
    with pytest.raises(dataclasses.FrozenInstanceError):
        mesh.device = get_device("cpu")
    on_tpu = dataclasses.replace(mesh, device="tpu-v5e")
    assert on_tpu.device.name == "tpu-v5e" and on_tpu.axes == mesh.axes


@pytest.mark.parametrize(
    "axes, error, message",
    [
        ({}, ValueError, "at least one axis"),
        ({"data": 0}, ValueError, "positive integer size"),
        ({"data": -2}, ValueError, "positive integer size"),
        ({"data": 2.0}, ValueError, "positive integer size"),
        ({"data": True}, ValueError, "positive integer size"),
        ([("data", 2), ("data", 2)], ValueError, "appears twice"),
        ({3: 2}, TypeError, "non-empty strings"),
        ({"": 2}, TypeError, "non-empty strings"),
        ([("data", 2, 1)], TypeError, r"\(name, size\) pairs"),
        (5, TypeError, "mapping like"),
    ],
)
def test_mesh_validation(axes, error, message):
    with pytest.raises(error, match=message):
        Mesh(axes)


def test_links_follow_node_boundaries_on_gpus():
    # 4 nodes of 8 GPUs: "model" (stride 1, 8 devices) stays in a node, "data" crosses nodes.
    mesh = Mesh({"data": 4, "model": 8}, device="h100")
    assert mesh.link("model") == mesh.device.intra_node
    assert mesh.link("data") == mesh.device.inter_node
    # (2, 4) on 8 GPUs: both axes live inside one node.
    small = Mesh({"data": 2, "model": 4}, device="h100")
    assert small.link("data") is small.device.intra_node
    assert small.link("model") is small.device.intra_node
    # A minor axis larger than a node crosses nodes too.
    wide = Mesh({"data": 2, "model": 16}, device="h100")
    assert wide.link("model") is wide.device.inter_node


def test_links_on_tpu_slices():
    mesh = Mesh({"replica": 2, "data": 16, "model": 16}, device="tpu-v5e")  # 2 slices of 256
    assert mesh.link("model") is mesh.device.intra_node
    assert mesh.link("data") is mesh.device.intra_node
    assert mesh.link("replica") is mesh.device.inter_node


def test_link_overrides():
    fast = Link(bandwidth=1e12, latency=1e-7)
    mesh = Mesh({"data": 4, "model": 8}, device="h100", links={"data": fast})
    assert mesh.link("data") is fast
    assert mesh.link("model") is mesh.device.intra_node
    assert "links=" in repr(mesh)
    with pytest.raises(ValueError, match="not in the mesh axes"):
        Mesh({"data": 4}, links={"model": fast})
    with pytest.raises(TypeError, match="must be a toast_lab Link"):
        Mesh({"data": 4}, links={"data": (1e9, 1e-6)})


# --- JAX interop ---------------------------------------------------------------------------


def test_jax_mesh_round_trip():
    mesh = Mesh({"data": 4, "model": 2}, device="tpu-v5e")
    jmesh = mesh.jax_mesh()
    assert isinstance(jmesh, jax.sharding.Mesh)
    assert jmesh.axis_names == ("data", "model")
    assert jmesh.devices.shape == (4, 2)
    assert jmesh.axis_types == (jax.sharding.AxisType.Auto,) * 2
    assert Mesh.from_jax(jmesh, device="tpu-v5e") == mesh


def test_jax_mesh_allows_with_sharding_constraint():
    jmesh = Mesh({"data": 4, "model": 2}).jax_mesh()
    sharding = jax.sharding.NamedSharding(jmesh, jax.sharding.PartitionSpec("data"))

    @jax.jit
    def f(x):
        return jax.lax.with_sharding_constraint(x * 2, sharding)

    out = f(jnp.ones((8, 4)))
    assert out.sharding.is_equivalent_to(sharding, 2)


def test_jax_mesh_on_chosen_devices():
    chosen = jax.devices()[4:]
    jmesh = Mesh({"data": 2, "model": 2}).jax_mesh(devices=chosen)
    assert set(jmesh.devices.flat) == set(chosen)


def test_jax_mesh_with_too_few_devices_says_how_to_simulate():
    mesh = Mesh({"data": 8, "model": 4})
    with pytest.raises(ValueError, match="needs 32 devices but JAX sees 8") as info:
        mesh.jax_mesh()
    assert "--xla_force_host_platform_device_count=32" in str(info.value)
    assert 'jax.config.update("jax_num_cpu_devices", 32)' in str(info.value)
