"""benchmarks/device_rates.py, the calibration script: it runs on this CPU (8 simulated devices
here, so its collectives run too), and the rates it measures are the ones its second estimate
uses."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

import toast_lab as tl

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "device_rates.py"


@pytest.fixture(scope="module")
def device_rates():
    spec = importlib.util.spec_from_file_location("device_rates", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["device_rates"] = module  # its dataclass resolves annotations by module name
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("device_rates", None)


def test_quick_run_measures_every_rate_and_compares_a_step(device_rates, tmp_path, monkeypatch,
                                                           capsys):
    out = tmp_path / "rates.json"
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--quick", "--reps", "1", "--json", str(out)])
    device_rates.main()
    printed = capsys.readouterr().out
    doc = json.loads(out.read_text())
    kinds = [row["what"].split()[0] for row in doc["rows"]]
    assert kinds == ["matmul", "attention", "elementwise", "exp", "all-reduce",
                     "all-gather"]
    for row in doc["rows"]:
        assert row["model_s"] > 0 and row["measured_s"] > 0 and row["work"] > 0, row
    # the measured spec takes its bandwidth from the elementwise kernel and its peak from the
    # preset or the fastest matmul, whichever is faster
    rate = {row["what"].split()[0]: row["rate"] for row in doc["rows"]}
    assert doc["measured"]["memory_bandwidth"] == pytest.approx(rate["elementwise"])
    preset = tl.get_device(doc["preset"]).peak_flops[doc["dtype"]]
    assert doc["measured"]["peak_flops"] == pytest.approx(max(preset, rate["matmul"]))
    assert 0 < doc["measured"]["matmul"] <= 1 and 0 < doc["measured"]["attention"] <= 1
    (step,) = doc["steps"]
    assert step["measured_s"] > 0 and step["estimate_preset_s"] > 0
    assert step["estimate_measured_s"] > 0
    assert "Training steps on one device" in printed and step["step"] in printed


def test_measured_spec_replaces_rates_not_structure(device_rates):
    row = device_rates.Row
    h100 = tl.get_device("h100")
    peak = h100.peak_flops["bfloat16"]
    mm = [row("matmul", 2.0, 1.0, 2.0 / (0.7 * peak))]          # 70% of peak
    attn = [row("attention", 1.0, 1.0, 1.0 / (0.5 * peak))]     # 50% of peak
    mem = [row("elementwise", 3e12, 1.0, 1.0)]                  # 3 TB/s
    spec = device_rates.measured_spec(h100, mm, attn, mem, "bfloat16")
    assert spec.peak_flops == h100.peak_flops
    assert spec.efficiency.matmul == pytest.approx(0.7)
    assert spec.efficiency.attention == pytest.approx(0.5)
    assert spec.efficiency.tile == h100.efficiency.tile
    assert spec.memory_bandwidth == pytest.approx(3e12)
    assert spec.efficiency.memory == 1.0  # the measured bandwidth, whole
    assert spec.intra_node == h100.intra_node and spec.platform == h100.platform
    # faster than the datasheet (a CPU preset is a stand-in): the peak rises to the measurement
    cpu = tl.get_device("cpu")
    fast = [row("matmul", 4e11, 1.0, 1.0)]
    spec = device_rates.measured_spec(cpu, fast, attn, mem, "float32")
    assert spec.peak_flops["float32"] == pytest.approx(4e11)
    assert spec.efficiency.matmul == pytest.approx(1.0)
    assert spec.efficiency.attention == cpu.efficiency.attention  # unfused on a CPU
