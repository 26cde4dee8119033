"""Monte Carlo Tree Search over the decision space: select, expand, roll out, back up.

Each function is small and separate (mctx's layout); the reward is a function of the
estimate (`reward` in _search.py) and the rollout policy a pluggable callable.

Selection is UCT on min-max normalized values:
    score(child) = q(child) + C_UCT * sqrt(ln N(parent) / N(child)),
    q = (value - min reward seen) / (max - min)  in [0, 1].
C_UCT = 0.5: rewards are log step-time ratios, a small range once normalized, and plans share
most of their structure, so exploitation pays; unvisited choices are always tried first.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ._tree import UNEXPANDED, Tree

C_UCT = 0.5


def select_and_expand(tree: Tree, space, choices: np.ndarray, rng, stats) -> tuple[list, int]:
    """Walks down from the root fixing `choices`, expanding one new node. Returns the path of
    nodes and the depth where the rollout starts."""
    node, path = 0, [0]
    n = len(space.decisions)
    depth = 0
    while depth < n:
        forced = _forced_choice(space, choices, depth)
        if forced >= 0:
            choice = forced
        else:
            kids = tree.children[node, :space.num_choices[depth]]
            fresh = np.nonzero(kids == UNEXPANDED)[0]
            if len(fresh):
                choice = int(fresh[rng.integers(len(fresh))])
                choices[depth] = choice
                node, created = tree.child(node, choice, tuple(choices[:depth + 1]))
                path.append(node)
                depth += 1
                if created:
                    return path, depth
                continue
            choice = _uct(tree, node, kids, stats)
        choices[depth] = choice
        node, created = tree.child(node, choice, tuple(choices[:depth + 1]))
        path.append(node)
        depth += 1
    return path, depth


def _forced_choice(space, choices, depth: int) -> int:
    d = space.decisions[depth]
    if d.pinned >= 0:
        return d.pinned
    if space.skipped(choices, depth):
        return 0
    return -1


def _uct(tree: Tree, node: int, kids: np.ndarray, stats) -> int:
    lo, hi = stats["min"], stats["max"]
    span = hi - lo if hi > lo else 1.0
    q = (tree.value[kids] - lo) / span
    explore = C_UCT * np.sqrt(math.log(max(tree.visits[node], 1)) / np.maximum(tree.visits[kids], 1))
    return int(np.argmax(q + explore))


def rollout(space, choices: np.ndarray, depth: int, policy: Callable, rng) -> np.ndarray:
    """Completes the assignment from `depth` with the cheap policy."""
    for pos in range(depth, len(space.decisions)):
        forced = _forced_choice(space, choices, pos)
        choices[pos] = forced if forced >= 0 else policy(pos, rng)
    return choices


def backup(tree: Tree, path: list, reward: float) -> None:
    for node in path:
        tree.visits[node] += 1
        tree.total[node] += reward
        if reward > tree.value[node]:
            tree.value[node] = reward


def incumbent_policy(space, incumbent: np.ndarray, keep: float = 0.5) -> Callable:
    """Rollout policy: the best plan's choice with probability `keep`, else uniform."""

    def policy(pos: int, rng) -> int:
        if rng.random() < keep:
            return int(incumbent[pos])
        return int(rng.integers(space.num_choices[pos]))

    return policy


def polish(space, choices: np.ndarray, evaluate: Callable, best: float,
           budget_left: Callable[[], bool], max_passes: int = 3) -> tuple[np.ndarray, float]:
    """Coordinate descent around a new incumbent: change one decision at a time while that
    helps. MCTS finds the right region; this finds the corner of it (a few dozen
    evaluations, counted as simulations by the caller's `evaluate`)."""
    choices = choices.copy()
    for _ in range(max_passes):
        improved = False
        for pos in range(len(space.decisions)):
            if _forced_choice(space, choices, pos) >= 0:
                continue
            keep = choices[pos]
            for c in range(space.num_choices[pos]):
                if c == keep:
                    continue
                if not budget_left():
                    choices[pos] = keep
                    return choices, best
                choices[pos] = c
                r = evaluate(choices)
                if r > best:
                    best, keep, improved = r, c, True
            choices[pos] = keep
        if not improved:
            break
    return choices, best
