"""Request records for the rule and replay tests.

Two ways to make them:

- :func:`stage` and :func:`request` build records by hand, times in ms from :data:`BASE_NS`.
- :func:`simulate_gateway` runs a small discrete-event model of an asyncio gateway (one event
  loop with a FIFO ready queue, model servers with a capacity, an optional lock around a
  stage, worker threads) and records what tracekit's core would record: stage intervals,
  cpu / wait / loop_wait, on_loop, max_block, loop slices and loop waits >= 1 ms, streaming
  chunk times. It is written independently of ``tracekit.analysis._replay_sim`` (no shared
  code), so a replay that reproduces its traces reproduces a known system, not itself.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tracekit import semconv
from tracekit.analysis.model import RequestRecord, StageRecord

BASE_NS = 1_700_000_000_000_000_000
_ids = itertools.count(1)


def ns(ms: float) -> int:
    """Absolute ns of an offset in ms from :data:`BASE_NS`."""
    return BASE_NS + round(ms * 1e6)


def _span_id() -> str:
    return f"{next(_ids):016x}"


def stage(
    name: str,
    start_ms: float,
    end_ms: float,
    *,
    kind: str | None = None,
    cpu_ms: float | None = None,
    wait_ms: float | None = None,
    loop_wait_ms: float | None = 0.0,
    on_loop: bool | None = True,
    max_block_ms: float | None = None,
    slices: Sequence[tuple[float, float]] = (),
    waits: Sequence[tuple[float, float]] = (),
    function: str | None = None,
    namespace: str | None = "app",
    parent: str | None = None,
    span_kind: str = "internal",
    attributes: dict[str, Any] | None = None,
    span_id: str | None = None,
) -> StageRecord:
    """A stage record; ``slices``/``waits`` are absolute (start_ms, end_ms) pairs."""
    instrumented = cpu_ms is not None or wait_ms is not None
    return StageRecord(
        name=name,
        kind=kind or (name if name in semconv.STAGE_KINDS else semconv.KIND_OTHER),
        span_id=span_id or _span_id(),
        parent_id=parent,
        start_ns=ns(start_ms),
        end_ns=ns(end_ms),
        span_kind=span_kind,
        wall_ms=end_ms - start_ms,
        cpu_ms=cpu_ms,
        wait_ms=wait_ms,
        loop_wait_ms=loop_wait_ms if instrumented else None,
        max_block_ms=max_block_ms,
        on_loop=on_loop if instrumented else None,
        code_function=function or (name if instrumented else None),
        code_namespace=namespace if instrumented else None,
        loop_slices=[(ns(a), ns(b)) for a, b in slices],
        loop_waits=[(ns(a), ns(b)) for a, b in waits],
        attributes=dict(attributes or {}),
    )


def request(
    route: str,
    start_ms: float,
    end_ms: float,
    stages: Sequence[StageRecord] = (),
    *,
    service: str = "gateway",
    instrumented: bool = True,
    cpu_ms: float | None = None,
    loop_wait_ms: float | None = None,
    slices: Sequence[tuple[float, float]] = (),
    waits: Sequence[tuple[float, float]] = (),
    span_id: str | None = None,
    trace_id: str | None = None,
    **extra: Any,
) -> RequestRecord:
    """A request record; top-level stages (parent ``None``) get this request as parent."""
    span = span_id or _span_id()
    records = list(stages)
    for record in records:
        if record.parent_id is None:
            record.parent_id = span
    if instrumented and cpu_ms is None:
        cpu_ms = sum(s.cpu_ms or 0.0 for s in records)
    if instrumented and loop_wait_ms is None:
        loop_wait_ms = sum(s.loop_wait_ms or 0.0 for s in records)
    return RequestRecord(
        trace_id=trace_id or f"{next(_ids):032x}",
        span_id=span,
        service=service,
        route=route,
        start_ns=ns(start_ms),
        end_ns=ns(end_ms),
        instrumented=instrumented,
        cpu_ms=cpu_ms if instrumented else None,
        loop_wait_ms=loop_wait_ms if instrumented else None,
        loop_slices=[(ns(a), ns(b)) for a, b in slices],
        loop_waits=[(ns(a), ns(b)) for a, b in waits],
        stages=records,
        **extra,
    )


# --- a simulated gateway ------------------------------------------------------------------
@dataclass(frozen=True)
class Op:
    """One piece of a request's work.

    kind: ``cpu`` (CPU on the event loop), ``block`` (holds the loop without CPU: a sync
    call), ``wait`` (awaits I/O), ``model`` (awaits a model server, see ``servers``),
    ``thread`` (runs on a worker thread for ``ms``: the stage is off the loop).
    stage: the stage it belongs to; ``None`` is the request's own code.
    chunk: a streamed body chunk leaves when this op ends.
    """

    kind: str
    ms: float
    stage: str | None = None
    chunk: bool = False


@dataclass
class Job:
    """A request to simulate: route, ops, and (open loop) its arrival time in ms."""

    route: str
    ops: list[Op]
    arrival_ms: float = 0.0
    kinds: dict[str, str] = field(default_factory=dict)  # stage name -> kind
    attributes: dict[str, dict[str, Any]] = field(default_factory=dict)  # stage -> attrs


@dataclass
class _State:
    job: Job
    start: float
    i: int = 0
    ops: list[tuple[int, float, float, float]] = field(default_factory=list)  # (op, ready, start, end)
    chunks: list[float] = field(default_factory=list)
    holds_lock: bool = False


def simulate_gateway(
    jobs: Sequence[Job],
    *,
    clients: int | None = None,
    think_ms: float = 0.3,
    servers: dict[str, int | None] | None = None,
    locked_stage: str | None = None,
    route_filter: Any = None,
) -> list[RequestRecord]:
    """Simulate an asyncio gateway serving ``jobs`` and record them like tracekit would.

    Args:
        jobs: the requests. Open loop: each starts at its ``arrival_ms``. Closed loop
            (``clients`` set): ``clients`` clients take the jobs in order, each sending its
            next request ``think_ms`` after its previous one ended.
        think_ms: closed loop: gap between a response and the client's next request.
        servers: model stage name -> server capacity (``None``: unlimited; a missing name
            is unlimited). Calls queue FIFO for a slot.
        locked_stage: a stage wrapped in one ``asyncio.Lock`` shared by all requests
            (acquired before the stage starts, released when it ends).

    Returns:
        The recorded requests, sorted by start.
    """
    servers = servers or {}
    events: list[tuple[float, int, str, Any]] = []
    seq = itertools.count()
    loop_queue: deque[tuple[_State, float]] = deque()
    loop_free = [True]
    busy = {name: 0 for name in servers}
    waiting: dict[str, deque[tuple[_State, float]]] = {name: deque() for name in servers}
    lock_queue: deque[_State] = deque()
    lock_held = [False]
    done: list[_State] = []
    pending = deque(jobs)

    def push(t: float, what: str, arg: Any) -> None:
        heapq.heappush(events, (t, next(seq), what, arg))

    def begin(job: Job, t: float) -> None:
        advance(_State(job, t), t)

    def advance(st: _State, t: float) -> None:
        """Run the request's next op from time t (the previous op ended at t)."""
        ops = st.job.ops
        if st.i >= len(ops):
            finish(st, t)
            return
        op = ops[st.i]
        if locked_stage is not None and op.stage == locked_stage and not st.holds_lock:
            if lock_held[0]:
                lock_queue.append(st)
                return
            lock_held[0] = True
            st.holds_lock = True
        if op.kind in ("cpu", "block"):
            previous = ops[st.i - 1] if st.i else None
            if previous is not None and previous.kind in ("cpu", "block") and st.ops and st.ops[-1][3] == t and not loop_free[0] and loop_owner[0] is st:
                run_loop_op(st, t, t)  # same step: the loop is still ours
            else:
                loop_queue.append((st, t))
                if loop_free[0]:
                    serve_loop(t)
        elif op.kind == "model" and servers.get(op.stage or "") is not None:
            name = op.stage or ""
            if busy[name] < (servers[name] or 0):
                busy[name] += 1
                push(t + op.ms, "model_done", (st, t, t, name))
            else:
                waiting[name].append((st, t))
        elif op.kind in ("wait", "model", "thread"):
            push(t + op.ms, "op_done", (st, t, t))
        else:
            raise ValueError(op.kind)

    loop_owner: list[_State | None] = [None]

    def serve_loop(t: float) -> None:
        if not loop_queue:
            loop_free[0] = True
            loop_owner[0] = None
            return
        st, ready = loop_queue.popleft()
        run_loop_op(st, ready, t)

    def run_loop_op(st: _State, ready: float, t: float) -> None:
        op = st.job.ops[st.i]
        loop_free[0] = False
        loop_owner[0] = st
        push(t + op.ms, "loop_done", (st, ready, t))

    def op_finished(st: _State, ready: float, start: float, t: float) -> None:
        op = st.job.ops[st.i]
        st.ops.append((st.i, ready, start, t))
        if op.chunk:
            st.chunks.append(t)
        st.i += 1
        nxt = st.job.ops[st.i] if st.i < len(st.job.ops) else None
        if st.holds_lock and (nxt is None or nxt.stage != locked_stage):
            st.holds_lock = False
            lock_held[0] = False
            if lock_queue:
                waiter = lock_queue.popleft()
                lock_held[0] = True
                waiter.holds_lock = True
                advance(waiter, t)
        advance(st, t)

    def finish(st: _State, t: float) -> None:
        done.append(st)
        if clients is not None and pending:
            push(t + think_ms, "arrive", pending.popleft())

    if clients is None:
        for job in jobs:
            push(job.arrival_ms, "arrive", job)
        pending.clear()
    else:
        for _ in range(min(clients, len(pending))):
            push(0.0, "arrive", pending.popleft())
    while events:
        t, _, what, arg = heapq.heappop(events)
        if what == "arrive":
            begin(arg, t)
        elif what == "loop_done":
            st, ready, start = arg
            op_finished(st, ready, start, t)
            # The request may have continued on the loop in the same step (run_loop_op).
            if loop_owner[0] is st and st.ops and st.ops[-1][3] == t and not _continues(st, t):
                serve_loop(t)
            elif loop_owner[0] is not st or not _continues(st, t):
                if loop_owner[0] is st:
                    serve_loop(t)
        elif what == "op_done":
            st, ready, start = arg
            op_finished(st, ready, start, t)
        elif what == "model_done":
            st, ready, start, name = arg
            busy[name] -= 1
            if waiting[name]:
                nxt, queued_at = waiting[name].popleft()
                busy[name] += 1
                push(t + nxt.job.ops[nxt.i].ms, "model_done", (nxt, queued_at, t, name))
            op_finished(st, ready, start, t)
    return sorted((_record(st) for st in done), key=lambda r: r.start_ns)


def _continues(st: _State, t: float) -> bool:
    """Whether the request kept the loop at t (its next op started on the loop at t)."""
    return bool(st.i < len(st.job.ops) and st.job.ops[st.i].kind in ("cpu", "block")
                and st.job.ops[st.i - 1].kind in ("cpu", "block"))  # fmt: skip


def _record(st: _State) -> RequestRecord:
    job = st.job
    req_id = _span_id()
    on_loop_kinds = ("cpu", "block")
    by_stage: dict[str, list[tuple[Op, float, float, float]]] = {}
    own: list[tuple[Op, float, float, float]] = []
    for index, ready, start, end in st.ops:
        op = job.ops[index]
        (by_stage.setdefault(op.stage, []) if op.stage else own).append((op, ready, start, end))
    end_ms = max(e for _, _, _, e in st.ops) if st.ops else st.start
    if st.chunks:
        end_ms = max(end_ms, st.chunks[-1])
    request_slices: list[tuple[float, float]] = []
    request_waits: list[tuple[float, float]] = []
    stages: list[StageRecord] = []
    for name, ops in by_stage.items():
        first = ops[0]
        s_start = first[2] if first[0].kind in on_loop_kinds else first[1]
        s_end = ops[-1][3]
        cpu = sum(e - s for op, _, s, e in ops if op.kind == "cpu")
        block = sum(e - s for op, _, s, e in ops if op.kind == "block")
        waited = sum(e - r for op, r, _, e in ops if op.kind in ("wait", "model"))
        loop_waits = [(r, s) for op, r, s, _ in ops[1:] if op.kind in on_loop_kinds and s > r]
        if first[0].kind in on_loop_kinds and first[2] > first[1]:
            request_waits.append((first[1], first[2]))  # the caller waited for the loop
        on_loop = not any(op.kind == "thread" for op, *_ in ops)
        runs = _runs([(s, e) for op, _, s, e in ops if op.kind in on_loop_kinds])
        thread = sum(e - s for op, _, s, e in ops if op.kind == "thread")
        loop_wait = sum(b - a for a, b in loop_waits)
        attrs = dict(job.attributes.get(name, {}))
        stages.append(
            stage(
                name,
                s_start,
                s_end,
                kind=job.kinds.get(name),
                cpu_ms=cpu + (thread if not on_loop else 0.0),
                wait_ms=waited + block,
                loop_wait_ms=loop_wait,
                on_loop=on_loop,
                max_block_ms=max((b - a for a, b in runs), default=0.0),
                slices=[r for r in runs if r[1] - r[0] >= 1.0],
                waits=[w for w in loop_waits if w[1] - w[0] >= 1.0],
                function=name,
                parent=req_id,
                attributes=attrs,
            )
        )
    for op, ready, start, _ in own:
        if op.kind in on_loop_kinds and start > ready:
            request_waits.append((ready, start))
    # The request's own steps: contiguous on-loop runs that contain own code. A run also
    # covers the sync stages called inside it, as the core's request ledger records it.
    all_loop = sorted((s, e, op.stage is None) for (op, _, s, e) in
                      [(job.ops[i], r, s, e) for i, r, s, e in st.ops] if op.kind in on_loop_kinds)  # fmt: skip
    for a, b, has_own in _runs_with_flag(all_loop):
        if has_own and b - a >= 1.0:
            request_slices.append((a, b))
    cpu_total = sum(e - s for i, _, s, e in st.ops if job.ops[i].kind == "cpu")
    cpu_total += sum(e - s for i, _, s, e in st.ops if job.ops[i].kind == "thread")
    loop_wait_total = sum(b - a for a, b in request_waits) + sum(
        sum(b - a for a, b in ((w[0], w[1]) for w in _ms_waits(s))) for s in stages
    )
    extra: dict[str, Any] = {}
    if st.chunks:
        gaps = [b - a for a, b in itertools.pairwise(st.chunks)]
        extra["ttft_ms"] = st.chunks[0] - st.start
        extra["chunks"] = len(st.chunks)
        if gaps:
            extra["itl_p50_ms"] = _pct(gaps, 0.5)
            extra["itl_p95_ms"] = _pct(gaps, 0.95)
            extra["itl_max_ms"] = max(gaps)
            extra["tpot_ms"] = (st.chunks[-1] - st.chunks[0]) / (len(st.chunks) - 1)
    return request(
        job.route,
        st.start,
        end_ms,
        stages,
        span_id=req_id,
        cpu_ms=cpu_total,
        loop_wait_ms=loop_wait_total,
        slices=request_slices,
        waits=[w for w in request_waits if w[1] - w[0] >= 1.0],
        **extra,
    )


def _ms_waits(record: StageRecord) -> list[tuple[float, float]]:
    return [((a - BASE_NS) / 1e6, (b - BASE_NS) / 1e6) for a, b in record.loop_waits]


def _runs(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and abs(a - out[-1][1]) < 1e-9:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _runs_with_flag(intervals: list[tuple[float, float, bool]]) -> list[tuple[float, float, bool]]:
    out: list[tuple[float, float, bool]] = []
    for a, b, flag in intervals:
        if out and abs(a - out[-1][1]) < 1e-9:
            out[-1] = (out[-1][0], b, out[-1][2] or flag)
        else:
            out.append((a, b, flag))
    return out


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)
