"""Many hosts: a plan over the devices of two processes gives the unsharded step's results.

Two local processes with 4 simulated CPU devices each join one JAX runtime
(`jax.distributed.initialize`, gloo collectives across processes) and run the tiny GPT's step
on a (data=4, model=2) mesh over all 8 devices (tests/multihost_worker.py).
"""

import os
import pathlib
import re
import socket
import subprocess
import sys
import time

import pytest

WORKER = pathlib.Path(__file__).with_name("multihost_worker.py")
NUM_PROCESSES = 2
TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_plan_runs_across_two_processes(tmp_path):
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    # Replace the parent's device count (conftest asks for 8): each process simulates 4.
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if "xla_force_host_platform_device_count" not in f]
    env["XLA_FLAGS"] = " ".join(flags + ["--xla_force_host_platform_device_count=4"])
    coordinator = f"localhost:{free_port()}"
    # Logs go to files, not pipes: a worker blocked on a full pipe would stall the other one
    # at their next collective.
    logs = [tmp_path / f"process{i}.log" for i in range(NUM_PROCESSES)]
    workers = []
    for i, log in enumerate(logs):
        with open(log, "w") as out:
            workers.append(subprocess.Popen(
                [sys.executable, str(WORKER), str(i), str(NUM_PROCESSES), coordinator],
                env=env, stdout=out, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + TIMEOUT_S  # one budget for all: a lone survivor would hang
    try:
        codes = [w.wait(timeout=max(1.0, deadline - time.monotonic())) for w in workers]
    except subprocess.TimeoutExpired:
        codes = None
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
    if codes is None:
        pytest.fail(f"workers did not finish within {TIMEOUT_S} s:\n" + _show(logs))
    if any(codes):
        pytest.fail(f"worker exit codes {codes}:\n" + _show(logs))


_NOISE = re.compile(r"\[Gloo\]|[IW]\d{4} ")


def _show(logs) -> str:
    # Keep the lines that say something: XLA's logged warnings and gloo's chatter are noise here.
    out = []
    for i, log in enumerate(logs):
        lines = [ln for ln in log.read_text().splitlines() if not _NOISE.match(ln)]
        out.append(f"--- process {i} output ---\n" + "\n".join(lines[-60:]))
    return "\n".join(out)
