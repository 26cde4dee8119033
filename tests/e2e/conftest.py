"""Browser tests: JupyterLab started here, driven by Debian's Chromium through Playwright.

Chromium is /usr/bin/chromium (or $TOAST_LAB_CHROMIUM); Playwright's own browser download is
never used. Without Chromium or the built extension the tests skip and say why; with
TOAST_LAB_E2E=1 (CI) that skip is a failure instead.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = Path(__file__).resolve().parent / "screenshots"
CHROMIUM = os.environ.get("TOAST_LAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
REQUIRED = os.environ.get("TOAST_LAB_E2E") == "1"


def unavailable(reason: str):
    """Skip with `reason`, or fail when TOAST_LAB_E2E=1 says the browser tests must run."""
    if REQUIRED:
        pytest.fail(f"TOAST_LAB_E2E=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def built_extension() -> Path | None:
    """The toast-lab extension JupyterLab will load: this checkout's build, else the installed one."""
    for candidate in (REPO / "toast_lab" / "labextension",
                      Path(sys.prefix) / "share" / "jupyter" / "labextensions" / "toast-lab"):
        if (candidate / "package.json").exists() and (candidate / "static").is_dir():
            return candidate
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LabServer:
    def __init__(self, url: str, token: str, root: Path, process: subprocess.Popen, log: Path):
        self.url, self.token, self.root, self.process, self.log = url, token, root, process, log

    def page_url(self, path: str = "lab") -> str:
        """`path` on this server, logged in, with a fresh workspace (no tabs of earlier tests)."""
        sep = "&" if "?" in path else "?"
        return f"{self.url}{path}{sep}reset&token={self.token}"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class ServerError(RuntimeError):
    """JupyterLab did not start; the message ends with its log."""


def start_lab_server(base: Path, ext: Path, timeout_s: float = 90, root: Path | None = None,
                     extra_args=()) -> LabServer:
    """JupyterLab on a free port with `ext` (a built toast-lab extension) first on its path,
    its own config and runtime dirs under `base`, and this checkout first on PYTHONPATH (so the
    kernel imports the code under test), serving `root` (default: a new `base`/root) with
    `extra_args` for the server. Used by the tests and by benchmarks/lab_latency.py."""
    if root is None:
        root = base / "root"
        root.mkdir(parents=True)
    # This checkout's extension first on JUPYTER_PATH, so the tests see the code they test.
    share = base / "share"
    (share / "labextensions").mkdir(parents=True)
    (share / "labextensions" / "toast-lab").symlink_to(ext)
    env = dict(os.environ)
    env.update({
        "JUPYTER_PATH": os.pathsep.join([str(share), env.get("JUPYTER_PATH", "")]).rstrip(os.pathsep),
        "JUPYTER_CONFIG_DIR": str(base / "config"),
        "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
        "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "JAX_PLATFORMS": "cpu",
    })
    # No news prompt over the page under test.
    settings = base / "config" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    port, token = _free_port(), uuid.uuid4().hex
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
           f"--ServerApp.token={token}", f"--ServerApp.root_dir={root}",
           "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           "--ServerApp.terminals_enabled=False", *extra_args]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log = base / "jupyterlab.log"
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=root)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + timeout_s
    while True:  # the server, not a page: poll its status API until it answers
        if process.poll() is not None:
            raise ServerError(f"JupyterLab exited ({process.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}api/status?token={token}", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            process.terminate()
            raise ServerError(f"JupyterLab did not start in {timeout_s:.0f} s:\n"
                              f"{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return LabServer(url, token, root, process, log)


def launch_browser(pw, chromium_path: str = CHROMIUM):
    """Debian's Chromium, headless, through Playwright (a persistent context of its own);
    returns (context, its user-data dir to remove after closing it)."""
    user_data = tempfile.mkdtemp(prefix="toast-lab-chromium-")
    context = pw.chromium.launch_persistent_context(
        user_data, executable_path=chromium_path, headless=True, args=CHROMIUM_ARGS,
        viewport={"width": 1500, "height": 950}, device_scale_factor=1)
    context.set_default_timeout(30_000)
    return context, user_data


@pytest.fixture(scope="session")
def chromium_path() -> str:
    if not Path(CHROMIUM).exists():
        unavailable(f"no Chromium at {CHROMIUM} (apt-get install -y chromium)")
    try:
        import playwright  # noqa: F401
    except ImportError:
        unavailable("the playwright package is not installed (pip install '.[test]')")
    return CHROMIUM


@pytest.fixture(scope="session")
def lab_server(chromium_path, tmp_path_factory) -> LabServer:
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        unavailable("jupyterlab is not installed (pip install '.[test]')")
    ext = built_extension()
    if ext is None:
        unavailable("the toast-lab extension is not built: run `pip install .` or `npm run build`")
    try:
        server = start_lab_server(tmp_path_factory.mktemp("lab"), ext)
    except ServerError as err:
        pytest.fail(str(err))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def kernelless_lab_server(lab_server, tmp_path_factory) -> LabServer:
    """A second JupyterLab on the same files with no kernel to start (no kernel specs): what
    a reader without toast-lab's Python (or any kernel) sees of saved plans and notebooks."""
    try:
        server = start_lab_server(
            tmp_path_factory.mktemp("lab-no-kernel"), built_extension(), root=lab_server.root,
            extra_args=["--KernelSpecManager.ensure_native_kernel=False",
                        "--KernelSpecManager.allowed_kernelspecs=none"])
    except ServerError as err:
        pytest.fail(str(err))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def browser_context(chromium_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context, user_data = launch_browser(pw, chromium_path)
        yield context
        context.close()
    shutil.rmtree(user_data, ignore_errors=True)


@pytest.fixture
def page(browser_context, request):
    page = browser_context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" and "toast" in m.text.lower() else None)
    page.toast_errors = errors
    yield page
    page.close()


def shoot(page, name: str, locator=None) -> Path:
    """A screenshot beside the test output, to be looked at as a user would."""
    SCREENSHOTS.mkdir(exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    (locator or page).screenshot(path=str(path))
    return path


def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj, indent=1))
    return path
