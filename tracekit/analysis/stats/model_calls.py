"""Model calls of many requests, read as customers of one FIFO server.

Used by the ``serialized-model-calls`` rule (is this a one-at-a-time server?) and by the
replay (how long did each call queue, and for how long did it hold the server?).

For each call: ``submit`` is when its request was ready to make it (the end of the sibling
stage or own loop slice just before it, else its parent's start), ``start``/``end`` are the
stage span's. Read as a single FIFO server in order of ``submit`` (Lindley's recursion run
backwards from the recorded departures): the call's service began at
``max(submit, previous end)``, so it queued ``max(0, previous end - submit)`` and was served
``end - max(submit, previous end)``. On a real one-at-a-time server (or behind a lock) these
service times look like the model's own latency; on a batching server, overlapping calls get
"service times" equal to their arrival spacing, far below the model's latency.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tracekit import semconv
from tracekit.analysis.model import RequestRecord, StageRecord
from tracekit.analysis.stats.intervals import StageTree, has_components


def is_model_stage(stage: StageRecord) -> bool:
    """A model call: a ``model`` stage, or a plain span with GenAI attributes."""
    if stage.kind == semconv.KIND_MODEL:
        return True
    return not has_components(stage) and semconv.GEN_AI_OPERATION_NAME in stage.attributes


@dataclass(slots=True)
class CallTiming:
    """One model call, with its FIFO-server reading (ns).

    Attributes:
        index: the request's index in the sequence given to :func:`model_calls`.
        stage: the model stage.
        submit_ns: when the request was ready to call the model.
        queue_ns: time waiting for earlier calls (FIFO reading).
        service_ns: time being served (FIFO reading).
    """

    index: int
    stage: StageRecord
    submit_ns: int
    queue_ns: int = 0
    service_ns: int = 0

    @property
    def wall_ns(self) -> int:
        """From submit to the answer."""
        return max(0, self.stage.end_ns - self.submit_ns)


def model_calls(
    requests: Sequence[RequestRecord], service: str, stage_name: str
) -> list[CallTiming]:
    """The calls of model stage ``stage_name`` in ``service``, read as one FIFO server.

    Args:
        requests: the request sample.
        service: the service whose calls are read together (they share the server).
        stage_name: the model stage's name.

    Returns:
        The calls in order of submit time, queue and service filled in.
    """
    calls: list[CallTiming] = []
    for index, req in enumerate(requests):
        if req.service != service:
            continue
        tree: StageTree | None = None
        for stage in req.stages:
            if stage.name != stage_name:
                continue
            tree = tree or StageTree(req)
            calls.append(CallTiming(index, stage, submit_time(stage, req, tree)))
    calls.sort(key=lambda c: (c.submit_ns, c.stage.start_ns))
    previous_end: int | None = None
    for call in calls:
        end = call.stage.end_ns
        begin = call.submit_ns if previous_end is None else max(call.submit_ns, previous_end)
        begin = min(begin, end)
        call.queue_ns = begin - call.submit_ns
        call.service_ns = end - begin
        previous_end = end if previous_end is None else max(previous_end, end)
    return calls


def submit_time(stage: StageRecord, req: RequestRecord, tree: StageTree) -> int:
    """When the request was ready to start ``stage`` (see the module docstring)."""
    parent = tree.parent(stage)
    ready = parent.start_ns if parent is not None else req.start_ns
    for sibling in tree.kids(parent):
        if sibling is not stage and sibling.end_ns <= stage.start_ns:
            ready = max(ready, sibling.end_ns)
    for _, piece_end in tree.own_slices(parent, req):
        if piece_end <= stage.start_ns:
            ready = max(ready, piece_end)
    return min(ready, stage.start_ns)
