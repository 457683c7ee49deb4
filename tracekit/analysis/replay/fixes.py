"""The replay's fix vocabulary: :class:`Fix`, and how a fix changes a request's replay program.

A rule proposes a code change and models it as a :class:`Fix` (``tracekit.analysis.replay``
re-exports it); the replay applies it to the recorded requests. The functions below are used
by :mod:`tracekit.analysis.replay.build` while it builds a program:

- ``thread`` / ``process`` / ``shrink``: the targeted stage's loop steps (:func:`loop_node`)
  move to the thread pool or the process pool, or shrink;
- ``gather`` / ``fanout``: a node's blocks (its gaps and its children's programs) are
  restructured into a :data:`PAR` (:func:`restructure`);
- ``model_overlap``: model calls hold a resource standing for the one-at-a-time server or
  lock (:class:`ModelCall`); the recorded wait for it before the stage goes
  (:func:`trim_before_outside_queues`), the replay produces its own.

Every function returns new lists: the lists it is given may be shared with other programs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tracekit.analysis.model import StageRecord
from tracekit.analysis.replay.nodes import merge_loops, trim_delays_before
from tracekit.analysis.replay.sim import CPU, DELAY, HOLD, LOOP, PAR, Node
from tracekit.errors import ConfigurationError

#: What a :class:`Fix` can do to the recorded requests (see ``docs/analyzer-rules.md``).
FIX_ACTIONS = ("thread", "process", "shrink", "gather", "fanout", "model_overlap")
#: The HOLD resources of the thread pool and the process pool.
THREADS = "threads"
PROCESSES = "processes"

#: A node's blocks: (the child stage whose program it is, or None; the nodes).
Blocks = list[tuple[StageRecord | None, list[Node]]]


@dataclass(frozen=True)
class Fix:
    """A transformation of the recorded requests that models a proposed code change.

    Attributes:
        action: one of :data:`FIX_ACTIONS`:

            - ``thread``: the stage's event-loop slices run on the thread pool instead
              (``asyncio.to_thread``); their CPU holds the GIL unless ``gil_free``.
            - ``process``: the slices run in a process pool (no GIL, ``cores`` in parallel).
            - ``shrink``: the slices' CPU is multiplied by ``factor`` (a faster library).
            - ``gather``: the stage and the later sibling stage ``other`` start together
              (speculative start); what ran between them runs before ``other`` as before.
            - ``fanout``: the stage's repeated sequential calls (same name, same parent)
              start together.
            - ``model_overlap``: calls of the model stage no longer wait for each other:
              the recorded one-at-a-time server (or lock) gets ``capacity`` slots.
        route: the route whose requests change (the event loop is shared by all routes).
        stage: the stage name; ``None`` means the request's own code outside any stage.
        gil_free: ``thread`` only: the moved work releases the GIL.
        factor: ``shrink`` only: the new CPU as a fraction of the recorded one.
        other: ``gather`` only: the stage started together with ``stage``.
        capacity: ``model_overlap`` only: concurrent calls after the fix (``None``: no limit).
        queue: ``model_overlap`` only: where the recorded waiting sits: ``"inside"`` the model
            stage (a one-at-a-time model server) or ``"outside"`` it (a lock or a blocking
            client in the gateway, before the stage starts).
        report_route: the route whose before/after figures the projection reports
            (default ``route``): fixing one route's stage can be what helps another.
    """

    action: str
    route: str
    stage: str | None
    gil_free: bool = False
    factor: float = 1.0
    other: str | None = None
    capacity: int | None = None
    queue: str = "inside"
    report_route: str | None = None

    @property
    def measured_route(self) -> str:
        """The route the projection's figures are for."""
        return self.report_route or self.route

    def __post_init__(self) -> None:
        if self.action not in FIX_ACTIONS:
            raise ConfigurationError(
                f"unknown fix action {self.action!r}; expected one of {', '.join(FIX_ACTIONS)}"
            )
        if not 0.0 <= self.factor <= 1.0:
            raise ConfigurationError(f"fix factor must be within [0, 1], not {self.factor}")
        if self.action == "gather" and not self.other:
            raise ConfigurationError("a gather fix needs the other stage's name")
        if self.capacity is not None and self.capacity < 1:
            raise ConfigurationError(f"model capacity must be >= 1, not {self.capacity}")
        if self.queue not in ("inside", "outside"):
            raise ConfigurationError(f"queue must be 'inside' or 'outside', not {self.queue!r}")


@dataclass(frozen=True)
class ModelCall:
    """A recorded model call's queueing, for replays with a one-at-a-time model server.

    Attributes:
        key: the HOLD resource standing for the server (or the lock).
        queue_out_ms: waiting before the stage started (a lock / blocking client).
        queue_in_ms: waiting inside the stage (the server's own queue).
        wrap_stage: hold the resource for the whole stage (a lock around the call) rather
            than for the model's answer only.
        service_ms: the server's own time on the call (prefill and decode, from its span):
            the call holds the server that long (its stage lasts at least as long); ``None``
            when the server did not say.
    """

    key: str
    queue_out_ms: float
    queue_in_ms: float
    wrap_stage: bool
    service_ms: float | None = None


def targets(fix: Fix | None, stage: StageRecord | None) -> bool:
    """Whether ``fix`` moves or shrinks the loop steps of ``stage`` (``None``: the
    request's own code)."""
    if fix is None or fix.action not in ("thread", "process", "shrink"):
        return False
    return fix.stage is None if stage is None else stage.name == fix.stage


def loop_node(fix: Fix | None, gil: float, block: float, targeted: bool) -> Node:
    """A loop step of ``gil`` ms CPU and ``block`` ms blocking, as ``fix`` has it run."""
    if not targeted or fix is None:
        return (LOOP, gil, block)
    if fix.action == "shrink":
        return (LOOP, gil * fix.factor, block)
    inner: list[Node] = []
    if gil > 0:
        inner.append((CPU, gil, fix.action == "thread" and not fix.gil_free))
    if block > 0:
        inner.append((DELAY, block))
    return (HOLD, THREADS if fix.action == "thread" else PROCESSES, inner)


def no_cpu_won(fix: Fix) -> Fix | None:
    """``fix`` with the CPU it moves off the loop winning no CPU from the host, or ``None``
    when it moves no CPU to another thread or process.

    The moved work then holds the GIL (a ``thread`` fix that is not ``gil_free``): the
    process gets one core, as the loop thread alone had. On a host short of CPU this is the
    far end of the projection's range (:class:`~tracekit.analysis.replay.Replayer`): there
    the thread a fix adds competes with the host's other load, and the fair sharing the
    replay assumes gave it more than the kernel did. Measured on the validation's busy host
    (two CPU hogs, 2 cores; ``cpu-on-loop``, docs/analyzer-rules.md "A host short of CPU"):
    the loop thread got 0.78 of a CPU while ready before the fix, its worker threads 0.55
    after it, and the process as much CPU a second as before.
    """
    if fix.action == "process" or (fix.action == "thread" and fix.gil_free):
        return replace(fix, action="thread", gil_free=False)
    return None


def restructure(fix: Fix | None, blocks: Blocks) -> Blocks:
    """A node's blocks with ``fix``'s overlap applied: ``gather`` starts ``fix.stage``
    together with its later sibling ``fix.other`` (what ran between them runs before
    ``fix.other``, as before); ``fanout`` starts all of ``fix.stage``'s sibling calls."""
    if fix is None or fix.action not in ("gather", "fanout"):
        return blocks
    names = [tag.name if tag is not None else None for tag, _ in blocks]
    if fix.action == "gather":
        if fix.stage not in names:
            return blocks
        i = names.index(fix.stage)
        later = [j for j in range(i + 1, len(blocks)) if names[j] == fix.other]
        if not later:
            return blocks
        j = later[0]
        rest = [node for _, items in blocks[i + 1 : j + 1] for node in items]
        par: Node = (PAR, [blocks[i][1], merge_loops(rest)])
        return [*blocks[:i], (None, [par]), *blocks[j + 1 :]]
    calls = [i for i, name in enumerate(names) if name == fix.stage]
    if len(calls) < 2:
        return blocks
    par = (PAR, [blocks[i][1] for i in calls])
    out = [b for i, b in enumerate(blocks) if i not in calls[1:]]
    out[calls[0]] = (None, [par])
    return out


def trim_before_outside_queues(model_calls: dict[str, ModelCall], blocks: Blocks) -> Blocks:
    """A lock (or blocking client) wait happened before the model stage started, in the
    block before it: the replay's HOLD produces that wait, so the recorded one goes."""
    if not model_calls:
        return blocks
    out = list(blocks)
    for index, (tag, _) in enumerate(out):
        call = model_calls.get(tag.span_id) if tag is not None else None
        if call is None or call.queue_out_ms <= 0 or index == 0:
            continue
        before, previous = out[index - 1]
        out[index - 1] = (before, trim_delays_before(previous, call.queue_out_ms))
    return out


def not_applied_note(fix: Fix) -> str:
    """The projection note when ``fix`` changed no recorded request's program."""
    if fix.action == "gather":
        where = f"{fix.stage!r} never runs before {fix.other!r} among the same parent's children"
    elif fix.action == "fanout":
        where = f"no {fix.stage!r} calls follow one another under one parent"
    else:
        where = f"no {fix.stage or 'request handler'!r} code to move"
    return (
        f"the replay found nowhere to apply this fix in the recorded requests ({where}), "
        f"so no projection is shown"
    )
