"""The Lab on a step written in plain JAX (no name scopes, layers in a Python loop, optax), as
most users' steps are: the graph it opens on must be as readable as the zoo's."""

from __future__ import annotations

import shutil

import pytest

from .conftest import REPO, shoot
from .notebooks import kernel_json, open_notebook

pytestmark = pytest.mark.e2e

LAB_CELL = '''\
import toast_lab as tl
import plain_jax_step as m

lab = tl.Lab(m.step, *m.example_args(), mesh=tl.Mesh({"data": 4, "model": 2}, device="h100"))
lab'''


def test_a_plain_jax_step_opens_on_its_functions_and_folded_layers(lab_server, page):
    from playwright.sync_api import expect

    shutil.copy(REPO / "tests" / "plain_jax_step.py", lab_server.root)
    page.set_viewport_size({"width": 1500, "height": 1300})
    open_notebook(lab_server, page, "plain_jax_lab.ipynb", [LAB_CELL])
    lab = page.locator(".tl-widget .tl-lab")
    nodes = lab.locator(".tl-svg g.node")
    expect(nodes.first).to_be_visible(timeout=180_000)
    view = kernel_json(page, "lab.view.to_dict()")
    expect(nodes).to_have_count(len(view["graph"]["nodes"]))
    assert len(view["graph"]["nodes"]) <= 40  # it drew 700 before ops were grouped by call
    # the loss function open on its layer (drawn once, ×2), the layer on its calls and its
    # busy lines, named by their source; the optimizer closed
    expect(lab.locator('g.cluster[id="cluster:loss_fn/layers*"]')).to_contain_text("layers* ×2")
    expect(lab.locator('g.node[id^="group.loss_fn/layers*/rms"]')).to_have_count(2)
    attention = lab.locator('g.node[id^="group.loss_fn/layers*/o = jnp.einsum"]')
    expect(attention).to_contain_text("(line 33)")
    expect(lab.locator('g.node[id="group.chain"]')).to_be_visible()
    page.mouse.move(5, 5)
    shoot(page, "plain_jax_lab", lab)  # as it opens: at a legible scale, not fitted
    lab.locator('.tl-icon-button[title="Fit the graph"]').click()
    shoot(page, "plain_jax_lab_fitted", lab)
    # a click opens the attention's line: its ops, and its einsum
    before = lab.locator(".tl-svg g.node").count()
    attention.click()
    expect(lab.locator('g.cluster[id$="(line 33)"]')).to_be_visible()
    expect(lab.locator('.tl-svg g.node[id^="op."]').first).to_be_visible()
    assert before < lab.locator(".tl-svg g.node").count() < 80
    lab.locator('.tl-icon-button[title="Fit the graph"]').click()
    page.mouse.move(5, 5)
    shoot(page, "plain_jax_lab_line", lab)
    assert not page.toast_errors, page.toast_errors


LLAMA_CELL = '''\
import toast_lab as tl

fn, args = tl.zoo.get("llama", layers=2)
lab = tl.Lab(fn, *args, mesh=tl.Mesh({"data": 4, "model": 2}, device="h100"))
lab'''


def test_a_busy_scope_opens_on_the_calls_and_lines_that_made_its_ops(lab_server, page):
    # llama's `attn` scope computes its RoPE and attention inline: 129 ops of its own, which
    # opened as a wall of ops; it opens on its two RoPE calls and its attention line
    from playwright.sync_api import expect

    page.set_viewport_size({"width": 1500, "height": 1300})
    open_notebook(lab_server, page, "llama_lab.ipynb", [LLAMA_CELL])
    lab = page.locator(".tl-widget .tl-lab")
    attn = lab.locator('g.node[id="group.layer/attn"]')
    expect(attn).to_be_visible(timeout=180_000)
    attn.click()
    expect(lab.locator('g.cluster[id="cluster:layer/attn"]')).to_be_visible()
    expect(lab.locator('g.node[id^="group.layer/attn/rope (line"]')).to_have_count(2)
    expect(lab.locator('g.node[id^="group.layer/attn/o = jax.nn.dot_product_attentio"]')
           ).to_be_visible()
    view = kernel_json(page, "lab.view.to_dict()")
    assert len(view["graph"]["nodes"]) < 60, len(view["graph"]["nodes"])
    page.mouse.move(5, 5)
    shoot(page, "busy_scope_lab", lab)
    assert not page.toast_errors, page.toast_errors
