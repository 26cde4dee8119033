"""The Lab on a model people bring: Hugging Face's Flax GPT-2, built from its config in the
notebook (random weights, nothing downloaded), in a training step whose labels are the tokens
shifted inside the step. At 1280 x 800 with JupyterLab's file browser open: the graph is drawn,
in more than two colours once a plan shards something, nothing is cut off, edge labels are
readable, and the saved notebook stays small.
"""

from __future__ import annotations

import pytest

from .conftest import shoot, unavailable
from .layout import clipped, graph_fit
from .notebooks import GRAPH_COLOURS, kernel_execute, kernel_json, open_notebook, save_notebook

pytestmark = pytest.mark.e2e

NOTEBOOK = "hf_gpt2_lab.ipynb"
HF_CELL = '''\
import jax
import jax.numpy as jnp
import optax
from transformers import FlaxGPT2LMHeadModel, GPT2Config

import toast_lab as tl

# GPT-2's architecture from its config, small, with random weights (nothing downloaded)
config = GPT2Config(vocab_size=4096, n_positions=256, n_embd=256, n_layer=2, n_head=4)
model = FlaxGPT2LMHeadModel(config, seed=0)
optimizer = optax.adamw(3e-4)


def train_step(params, opt_state, input_ids):
    def loss_fn(params):
        logits = model(input_ids, params=params, train=False).logits
        # next-token prediction: the labels are the tokens shifted inside the step
        return optax.softmax_cross_entropy_with_integer_labels(
            logits[:, :-1], input_ids[:, 1:]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


params = model.params
input_ids = jnp.zeros((16, 256), jnp.int32)
lab = tl.Lab(train_step, params, optimizer.init(params), input_ids,
             mesh=tl.Mesh({"data": 4, "model": 2}, device="h100"))
lab'''
TABS = ("decisions", "estimate", "scopes", "details", "export")
MIN_EDGE_LABEL_PX = 11
MIN_NODE_TEXT_PX = 8  # a graph too wide to fit at 0.8 px/pt is fitted to the pane's width



def test_a_hugging_face_flax_model_in_the_lab(lab_server, page):
    from playwright.sync_api import expect

    try:
        import transformers  # noqa: F401
        from transformers import FlaxGPT2LMHeadModel  # noqa: F401
    except ImportError:
        unavailable("transformers with its Flax models is not installed (pip install '.[test]')")
    page.set_viewport_size({"width": 1280, "height": 800})
    open_notebook(lab_server, page, NOTEBOOK, [HF_CELL])
    lab = page.locator(".tl-widget .tl-lab")
    expect(lab.locator(".tl-svg g.node").first).to_be_visible(timeout=300_000)
    view = kernel_json(page, "lab.view.to_dict()")
    expect(lab.locator(".tl-svg g.node")).to_have_count(len(view["graph"]["nodes"]))
    page.mouse.move(5, 5)
    lab.locator(".tl-graph").scroll_into_view_if_needed()
    shoot(page, "hf_gpt2_first_view")
    _readable(lab)

    # a plan that shards: the graph takes the classes' colours, the collectives their labels
    count = int(lab.locator(".tl-graph").get_attribute("data-render-count"))
    kernel_execute(page, "from toast_lab.strategies import expert\n"
                         "lab.set_plan(expert(lab.analysis, lab.mesh)['fsdp'])")
    page.wait_for_function(
        "n => Number(document.querySelector('.tl-widget .tl-graph').dataset.renderCount) > n",
        arg=count)
    sharded = [c for c in kernel_json(page, "lab.view.to_dict()")["classes"] if c["axes"]]
    assert sharded, "fsdp shards some class"
    colours = lab.evaluate(GRAPH_COLOURS)
    assert len(colours) > 2, colours
    fit = _readable(lab)
    assert fit["labels"], "fsdp pays collectives on some edges"
    page.mouse.move(5, 5)
    lab.locator(".tl-graph").scroll_into_view_if_needed()
    shoot(page, "hf_gpt2_fsdp")
    for tab in TABS:
        lab.locator(f'.tl-tab[data-tab="{tab}"]').click()
        assert clipped(lab) == [], tab
    lab.locator('.tl-tab[data-tab="decisions"]').click()
    lab.locator(".tl-tab-body").scroll_into_view_if_needed()
    shoot(page, "hf_gpt2_decisions")

    size = save_notebook(page, lab_server, NOTEBOOK)
    print(f"saved notebook with the Lab on HF GPT-2: {size / 1e3:.1f} kB")
    assert size < 1_000_000, size
    assert not page.toast_errors, page.toast_errors


def _readable(lab) -> dict:
    """Nothing cut off; the graph as the pane frames it: all of it, or (too large to read
    whole) all its width from the top; edge labels >= 11 px on screen."""
    assert clipped(lab) == []
    fit = graph_fit(lab)
    framing = lab.locator(".tl-graph").get_attribute("data-framing")
    pane = lab.locator(".tl-graph-viewport").bounding_box()
    drawn = lab.locator(".tl-zoom").bounding_box()
    if framing == "whole":
        assert fit["outside"] == [] and fit["covered"] == [], fit
    else:
        assert framing == "width", framing
        assert pane["x"] - 1 <= drawn["x"] and drawn["x"] + drawn["width"] <= pane["x"] + pane["width"] + 1
        assert pane["y"] <= drawn["y"] <= pane["y"] + 40  # from its top (and Graphviz's margin)
    assert fit["nodeTextPx"] >= MIN_NODE_TEXT_PX, fit["nodeTextPx"]
    small = [x for x in fit["labels"] if x["px"] < MIN_EDGE_LABEL_PX - 0.01]
    assert not small, small
    return fit
