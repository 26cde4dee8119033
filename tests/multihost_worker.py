"""One process of the two-process test (tests/test_multihost.py): a plan on a mesh over devices
of several processes.

    python tests/multihost_worker.py PROCESS_ID NUM_PROCESSES COORDINATOR_ADDRESS

The parent sets XLA_FLAGS=--xla_force_host_platform_device_count=4 and JAX_PLATFORMS=cpu, so
each process has 4 CPU devices and the global mesh (data=4, model=2) has 8. Every process
builds the same global inputs from the same seeded host data, runs the plan's jit, and checks
the output shards it holds against the unsharded step computed on its own first CPU device.
Exits 0 when every addressable shard matches, 1 (with the mismatches on stderr) otherwise.
"""

from __future__ import annotations

import sys

import jax
import numpy as np

# Cross-process collectives on CPU. gloo is jax 0.10's default; say so anyway, since without a
# collectives implementation a multi-process CPU computation fails at its first all-reduce.
jax.config.update("jax_cpu_collectives_implementation", "gloo")


def main(process_id: int, num_processes: int, coordinator: str) -> int:
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id)
    import toast_lab as tl
    from toast_lab.verification import FAST_COMPILE, compare_outputs

    assert jax.process_count() == num_processes, jax.process_count()
    assert len(jax.devices()) == 4 * num_processes, jax.devices()
    local = jax.local_devices()[0]

    fn, args = tl.zoo.get("gpt")
    analysis = tl.analyze(tl.trace(fn, *args))
    mesh = tl.Mesh({"data": 4, "model": 2})
    plan = (tl.Plan.replicated(analysis).with_axes("batch", "data")
            .with_axes("heads", "model").with_axes("mlp", "model")).validate(mesh)
    jax_mesh = mesh.jax_mesh()  # all 8 global devices: this process holds two rows of "data"

    # The same host data in every process (a seeded draw, computed on this process's device).
    with jax.default_device(local):
        host = jax.device_get(tl.zoo.sample("gpt", seed=0))

    in_shardings, _ = plan.shardings(jax_mesh)

    def global_array(x, sharding):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    global_args = jax.tree.map(global_array, host, in_shardings)
    step = plan.jit(fn, jax_mesh, compiler_options=FAST_COMPILE)
    out = step(*global_args)

    # The unsharded step on this process's own device only: committed local inputs keep the
    # whole computation (and its result) local.
    reference = jax.jit(fn, compiler_options=FAST_COMPILE)(*jax.device_put(host, local))
    reference = jax.device_get(reference)

    names, mine, theirs = [], [], []
    for (path, leaf), ref in zip(jax.tree_util.tree_leaves_with_path(out),
                                 jax.tree.leaves(reference)):
        shards = leaf.addressable_shards
        assert shards, f"process {process_id} holds no shard of {jax.tree_util.keystr(path)}"
        names.append(jax.tree_util.keystr(path))
        mine.append(np.concatenate([np.asarray(s.data).ravel() for s in shards]))
        theirs.append(np.concatenate([np.asarray(ref)[s.index].ravel() for s in shards]))
    checks = compare_outputs(mine, theirs)
    bad = [(name, c) for name, c in zip(names, checks) if not c.ok]
    for name, c in bad:
        print(f"process {process_id}: output {name} ({c.dtype}, its shards here) error "
              f"{c.error:.3g} > tolerance {c.tolerance:g}", file=sys.stderr)
    jax.distributed.shutdown()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]))
