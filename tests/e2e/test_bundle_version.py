"""The built extension, package.json and the Python package are one release."""

from __future__ import annotations

import json
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
