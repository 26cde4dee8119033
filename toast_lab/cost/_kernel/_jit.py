"""How the kernel's functions are compiled.

`jit` compiles a function with numba, cached on disk (keyed on the cost model's sources:
_cache.py), and without numba's reference counting
(`_nrt=False`): every array the kernel touches is allocated once, in Python (the model's tables
and its Workspace), so no compiled function allocates or frees, and counting references is all
cost. It is not small: numba increfs and decrefs every array argument at each call of a
function it cannot inline, two atomic operations per array (measured: a helper taking six
arrays, called for each of 131 operands, ran in 92 ns a call counted, 16 ns not). The entries
that allocate what they hand back (_driver.py) keep it.

Nor has any of them a Python entry (`no_cpython_wrapper`, `no_cfunc_wrapper`): only the
kernel's one entry (_driver._entry) is called from Python, and a wrapper unboxes every array
of the tables and workspace it is handed, code that numba generates, optimises and emits for
each function (about a seventh of a cold compile).

`inline` is the same for small helpers called in the inner loops, inlined into their callers;
being inlined by numba, they keep a Python entry (the cost model prices shard_map bodies'
collectives with _charge's time functions).
"""

from __future__ import annotations

from numba import njit

from . import _cache

# every kernel function is cached under a hash of the cost model's sources (_cache.py)
_cache.install()

jit = njit(cache=True, _nrt=False, no_cpython_wrapper=True, no_cfunc_wrapper=True)
inline = njit(cache=True, _nrt=False, inline="always")
