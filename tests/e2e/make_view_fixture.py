"""Writes the browser tests' view-model fixtures with the real Lab (`toast_lab.lab`):

- tests/data/lab_view_gpt.json: the ViewModel JSON (exactly what the widget's `view` traitlet
  carries) of the zoo GPT at GPT-2-small width, 2 layers, on data=4 x model=2 TPU v5e, with
  batch pinned to data and seq to model (so the attention conflict is active), the rest found
  by a short seeded search (so the view has a search history), default groups open;
- tests/data/lab_view_gpt_answers.json: what the Lab answers to the events
  tests/e2e/test_lab_widget.py sends its stand-in kernel: the graph and groups after opening
  `block*/mlp`, and the details of the first op drawn in it.

Regenerate after changing the view model (`PYTHONPATH=. python tests/e2e/make_view_fixture.py`);
tests/test_lab_viewmodel.py checks that the fixture still reads as a ViewModel.
"""

from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"
VIEW = DATA / "lab_view_gpt.json"
ANSWERS = DATA / "lab_view_gpt_answers.json"
OPENED = "block*/mlp"  # the group the widget test opens


def build() -> tuple[dict, dict]:
    """(the view model, the answers) as JSON-ready dicts."""
    import toast_lab as tl
    from toast_lab.lab import Lab

    fn, args = tl.zoo.get("gpt", size="gpt2-small", layers=2)
    lab = Lab(fn, *args, mesh=tl.Mesh({"data": 4, "model": 2}, device="tpu-v5e"), widget=False)
    lab.pin("batch", "data")
    lab.pin("seq", "model")
    lab.search(simulations=400, seed=0, background=False)
    view = lab.view.to_dict()
    lab.toggle(OPENED)
    opened = lab.view.to_dict()
    op = next(n["op"] for n in opened["graph"]["nodes"]
              if n["kind"] == "op" and n["id"] not in {m["id"] for m in view["graph"]["nodes"]})
    lab.select("op", op)
    answers = {"toggle": {OPENED: {"graph": opened["graph"], "groups": opened["groups"]}},
               "select": {str(op): lab.view.to_dict()["details"]}}
    return view, answers


def _portable(doc: dict) -> str:
    """JSON with source paths relative to the checkout, or to site-packages for a library's
    line (the fixture is the same everywhere)."""
    import sysconfig

    text = json.dumps(doc, indent=1)
    for root in (str(Path(__file__).resolve().parents[2]), sysconfig.get_paths()["purelib"]):
        text = text.replace(root + "/", "")
    return text + "\n"


def main() -> None:
    view, answers = build()
    VIEW.write_text(_portable(view))
    ANSWERS.write_text(_portable(answers))
    print(f"wrote {VIEW} ({len(view['graph']['nodes'])} nodes) and {ANSWERS}")


if __name__ == "__main__":
    main()
