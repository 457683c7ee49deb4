"""What a request's replay program is made of, kept between the replays of one sample.

A node's *plan* (its gaps' nodes, its child clusters' recorded arguments) does not depend on
the fix being modelled, and neither does the finished program of a node whose subtree the
fix does not touch (:func:`touched_nodes`). :class:`ProgramMemo` keeps both per request, so
that ``_replay_build.ProgramBuilder`` rebuilds, for a fix, only the nodes on the path to
what the fix changes.
"""

from __future__ import annotations

from typing import Any

from tracekit.analysis.model import StageRecord
from tracekit.analysis.replay.fixes import Fix, ModelCall, targets
from tracekit.analysis.replay.sim import Node
from tracekit.analysis.stats.intervals import StageTree

ROOT = 0  # the memo key of the request's own node (stages are keyed by id(), never 0)

class Block:
    """A piece of a node's timeline: a gap (``items``), one child stage's program (``tag``;
    ``items`` once built without a fix touching it), or a cluster of overlapping children
    (``args``: the arguments of ``ProgramBuilder._cluster``; ``items`` likewise)."""

    __slots__ = ("args", "items", "tag")

    def __init__(self, tag: StageRecord | None, items: list[Node] | None, args: Any = None):
        self.tag = tag
        self.items = items
        self.args = args


class Plan:
    """A node cut into blocks; a leaf's whole program (``leaf``) instead."""

    __slots__ = ("blocks", "clustered", "consumer", "leaf")

    def __init__(self, blocks: list[Block], consumer: float, leaf: list[Node] | None = None):
        self.blocks = blocks
        self.consumer = consumer
        self.leaf = leaf
        self.clustered = any(b.tag is not None or b.args is not None for b in blocks)


class ProgramMemo:
    """The parts of one request's program, kept between the replays of a sample.

    Holds the stage tree, every node's program as built without a fix (``items``), and the
    plans of the nodes with children (``plans``), which a fix touching a child reassembles.
    Cost: memory of the order of twice the program, per request kept.
    """

    __slots__ = ("items", "plans", "tree")

    def __init__(self) -> None:
        self.tree: StageTree | None = None
        self.items: dict[int, list[Node]] = {}
        self.plans: dict[int, Plan] = {}



def touched_nodes(
    tree: StageTree, fix: Fix | None, model_calls: dict[str, ModelCall]
) -> tuple[set[int], set[int]]:
    """Keys of the nodes whose own program ``fix`` or the held ``model_calls`` change (a
    stage the fix moves or shrinks, the parent whose children it restructures or whose child
    holds a model call, and their ancestors), and of the children whose program *as a
    child* changes (those, the held model calls, and the stages a gather or fan-out names:
    a cluster of overlapping children that holds one is rebuilt).

    Args:
        tree: the request's replay tree (span ids unique).
        fix: the fix, for this request's route, or ``None``.
        model_calls: span id -> the model call held by a resource.
    """
    stages = list(tree.by_id.values())
    parent = tree.parent

    calls = [s for s in stages if s.span_id in model_calls]
    seeds: list[StageRecord | None] = [parent(s) for s in calls]
    if fix is not None and fix.action in ("gather", "fanout"):
        named = [s for s in stages if s.name == fix.stage]
        seeds += [parent(s) for s in named]
        calls += named  # a cluster holding one is restructured inside (its chains)
    else:
        seeds += [s for s in stages if targets(fix, s)]
    touched: set[int] = set()
    for seed in seeds:
        node = seed
        while node is not None and id(node) not in touched:
            touched.add(id(node))
            node = parent(node)
    if seeds or targets(fix, None):
        touched.add(ROOT)
    return touched, touched | {id(s) for s in calls}
