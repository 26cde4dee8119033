"""The built extension, package.json and the Python package are one release."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

from .conftest import REPO, built_extension, unavailable


def test_built_bundle_version_matches_the_python_package():
    ext = built_extension()
    if ext is None:
        unavailable("the toast-lab extension is not built: run `pip install .` or `npm run build`")
    bundle = json.loads((ext / "package.json").read_text())
    source = json.loads((REPO / "package.json").read_text())
    python = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    from toast_lab.lab._widget import LabView, MODULE_VERSION

    assert bundle["name"] == source["name"] == "toast-lab"
    assert bundle["version"] == source["version"] == python == MODULE_VERSION, (
        f"built bundle {bundle['version']}, package.json {source['version']}, "
        f"pyproject.toml {python}: rebuild with `pip install .` after changing the version")
    # The widget asks the front end for this module and a version range the bundle satisfies.
    assert LabView._model_module.default_value == bundle["name"]
    assert LabView._view_module_version.default_value == f"^{bundle['version']}"


def test_the_bundled_bokehjs_is_the_python_bokeh():
    """The extension loads BokehJS for the charts (no output embeds it): the version that
    package.json pins, that the lock file installs and that the built bundle carries is the
    Python `bokeh` installed, and the one pyproject.toml pins."""
    import bokeh

    source = json.loads((REPO / "package.json").read_text())
    pinned = source["dependencies"]["@bokeh/bokehjs"]
    lock = json.loads((REPO / "package-lock.json").read_text())
    locked = lock["packages"]["node_modules/@bokeh/bokehjs"]["version"]
    python = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"bokeh=={pinned}" in python, python
    assert pinned == locked == bokeh.__version__, (
        f"package.json pins @bokeh/bokehjs {pinned}, the lock has {locked}, Python has bokeh "
        f"{bokeh.__version__}: they must be one release")
    ext = built_extension()
    if ext is None:
        unavailable("the toast-lab extension is not built: run `pip install .` or `npm run build`")
    bundle = json.loads((ext / "package.json").read_text())
    assert bundle["dependencies"]["@bokeh/bokehjs"] == pinned
    # BokehJS's own build, as published, beside the bundle (src/bokeh.ts loads it)
    emitted = list((ext / "static").glob("bokeh.min.*.js"))
    assert len(emitted) == 1, emitted
    assert f'version="{pinned}"' in emitted[0].read_text()[:2_000_000]


def test_jupyter_lists_the_extension_enabled(tmp_path):
    """`jupyter labextension list` (as a user checks an install) shows toast-lab, this
    release, enabled and OK: its package.json, install.json and bundle are what JupyterLab
    accepts. The built extension is put first on JUPYTER_PATH, as the browser tests do."""
    ext = built_extension()
    if ext is None:
        unavailable("the toast-lab extension is not built: run `pip install .` or `npm run build`")
    share = tmp_path / "share"
    (share / "labextensions").mkdir(parents=True)
    (share / "labextensions" / "toast-lab").symlink_to(ext)
    env = dict(os.environ, JUPYTER_PATH=os.pathsep.join(
        [str(share), os.environ.get("JUPYTER_PATH", "")]).rstrip(os.pathsep))
    out = subprocess.run([sys.executable, "-m", "jupyter", "labextension", "list"], env=env,
                         capture_output=True, text=True, timeout=120)
    listing = out.stdout + out.stderr
    version = json.loads((REPO / "package.json").read_text())["version"]
    line = next((ln for ln in listing.splitlines() if "toast-lab" in ln), None)
    assert line is not None, listing
    assert f"toast-lab v{version}" in line and "enabled" in line and "OK" in line, listing


def test_a_development_install_links_the_built_extension():
    """`jupyter labextension develop .` links what toast_lab says is its built extension: the
    bundle the package build writes, under the name JupyterLab loads it by."""
    import toast_lab

    [entry] = toast_lab._jupyter_labextension_paths()
    built = REPO / "toast_lab" / entry["src"]
    assert entry["dest"] == json.loads((REPO / "package.json").read_text())["name"]
    assert built.resolve() == (REPO / json.loads((REPO / "package.json").read_text())
                               ["jupyterlab"]["outputDir"]).resolve()
