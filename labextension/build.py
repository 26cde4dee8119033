"""The package build's JupyterLab-extension step (pyproject.toml's jupyter-builder hook).

hatch_jupyter_builder's `npm_builder` runs `npm install`, which rewrites package-lock.json
whenever the npm in use resolves or records anything differently from the one that wrote it
(another npm version, another `omit-lockfile-registry-resolved`, optional packages of other
platforms), so that a fresh clone's tree is dirty after `pip install .`. This step is that
builder with `npm ci`, which installs exactly the lock file, never writes it, and fails when it
does not match package.json (update it with `npm install` and commit it).
"""

from __future__ import annotations

from pathlib import Path

from hatch_jupyter_builder.utils import is_stale, normalize_cmd, run


def npm_ci_builder(target_name: str, version: str, path: str = ".",
                   build_dir: str | None = None, source_dir: str | None = None,
                   build_cmd: str = "build", npm: str | list = "npm",
                   editable_build_cmd: str | None = None, force: bool = False) -> None:
    """`npm ci`, then `npm run <build_cmd>` in `path`, unless `build_dir` is newer than
    `source_dir` (and not `force`). Arguments as hatch_jupyter_builder.npm_builder's."""
    root = str(Path(path).resolve())
    if version == "editable" and editable_build_cmd:
        build_cmd = editable_build_cmd
    if build_dir and source_dir and not force and not is_stale(build_dir, source_dir):
        return
    cmd = normalize_cmd(npm)
    run([*cmd, "ci"], cwd=root)
    run([*cmd, "run", build_cmd], cwd=root)
