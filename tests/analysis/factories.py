"""Request records for the rule and replay tests.

Two ways to make them:

- :func:`stage` and :func:`request` build records by hand, times in ms from :data:`BASE_NS`.
- :func:`simulate_gateway` runs a small discrete-event model of an asyncio gateway (one event
  loop with a FIFO ready queue, model servers with a capacity, an optional lock around a
  stage, worker threads) and records what tracekit's core would record: stage intervals,
  cpu / wait / loop_wait, on_loop, max_block, loop slices and loop waits >= 1 ms, streaming
  chunk times. It is written independently of ``tracekit.analysis.replay.sim`` (no shared
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
from tracekit._percentile import percentile
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
    ops: list[tuple[int, float, float, float]] = field(
        default_factory=list
    )  # (op, ready, start, end)
    steps: list[tuple[float, float]] = field(default_factory=list)  # the request's loop steps
    chunks: list[float] = field(default_factory=list)
    holds_lock: bool = False


_ON_LOOP = ("cpu", "block")


def simulate_gateway(
    jobs: Sequence[Job],
    *,
    clients: int | None = None,
    think_ms: float = 0.3,
    ramp_ms: float = 0.0,
    servers: dict[str, int | None] | None = None,
    locked_stage: str | None = None,
) -> list[RequestRecord]:
    """Simulate an asyncio gateway serving ``jobs`` and record them like tracekit would.

    A *step* is a run of consecutive on-loop ops of one request (no await between them): it
    waits for the loop once, then holds it until the run ends. The loop runs in asyncio's
    iterations: an iteration runs the steps that were ready when it began; steps woken
    meanwhile by a worker thread or a lock hand-off (``call_soon``) are queued at once, those
    woken by I/O (an awaited wait or model call ending, a new request) join when the next
    iteration begins.

    Args:
        jobs: the requests. Open loop: each starts at its ``arrival_ms``. Closed loop
            (``clients`` set): ``clients`` clients take the jobs in order, each sending its
            next request ``think_ms`` after its previous one ended.
        think_ms: closed loop: gap between a response and the client's next request.
        ramp_ms: closed loop: client ``k`` sends its first request at ``k * ramp_ms``.
        servers: model stage name -> server capacity (a missing name, or ``None``:
            unlimited). Calls queue FIFO for a slot.
        locked_stage: a stage wrapped in one ``asyncio.Lock`` shared by all requests
            (acquired before the stage starts, released when it ends).

    Returns:
        The recorded requests, sorted by start.
    """
    servers = servers or {}
    events: list[tuple[float, int, str, Any]] = []
    seq = itertools.count()
    loop_queue: deque[tuple[_State, float]] = deque()
    io_queue: deque[tuple[_State, float]] = deque()  # joins at the next iteration
    batch = [0]  # steps left in the current iteration
    loop_idle = [True]
    busy = dict.fromkeys(servers, 0)
    queued: dict[str, deque[tuple[_State, float]]] = {name: deque() for name in servers}
    lock_queue: deque[_State] = deque()
    lock_held = [False]
    done: list[_State] = []
    pending = deque(jobs)

    def push(t: float, what: str, arg: Any) -> None:
        heapq.heappush(events, (t, next(seq), what, arg))

    def advance(st: _State, t: float, io: bool = False) -> None:
        ops = st.job.ops
        if st.i >= len(ops):
            done.append(st)
            if clients is not None and pending:
                push(t + think_ms, "arrive", pending.popleft())
            return
        op = ops[st.i]
        if op.stage is not None and op.stage == locked_stage and not st.holds_lock:
            if lock_held[0]:
                lock_queue.append(st)
                return
            lock_held[0] = st.holds_lock = True
        if op.kind in _ON_LOOP:
            if loop_idle[0]:
                loop_queue.append((st, t))
                iterate(t)
            else:
                (io_queue if io else loop_queue).append((st, t))
        elif op.kind == "model" and servers.get(op.stage or "") is not None:
            name = op.stage or ""
            if busy[name] < (servers[name] or 0):
                busy[name] += 1
                push(t + op.ms, "model_done", (st, t, name))
            else:
                queued[name].append((st, t))
        elif op.kind in ("wait", "model", "thread"):
            push(t + op.ms, "op_done", (st, t))
        else:
            raise ValueError(f"unknown op kind {op.kind!r}")

    def iterate(t: float) -> None:
        loop_queue.extend(io_queue)
        io_queue.clear()
        batch[0] = len(loop_queue)
        serve_loop(t)

    def serve_loop(t: float) -> None:
        if batch[0] <= 0:
            if loop_queue or io_queue:
                iterate(t)
            else:
                loop_idle[0] = True
            return
        batch[0] -= 1
        loop_idle[0] = False
        st, ready = loop_queue.popleft()
        ops = st.job.ops
        cursor, j = t, st.i
        while j < len(ops) and ops[j].kind in _ON_LOOP:
            end = cursor + ops[j].ms
            st.ops.append((j, ready if j == st.i else cursor, cursor, end))
            if ops[j].chunk:
                st.chunks.append(end)
            cursor, j = end, j + 1
        st.steps.append((t, cursor))
        push(cursor, "step_done", (st, j))

    def release_lock(st: _State, t: float) -> None:
        ops = st.job.ops
        if st.holds_lock and (st.i >= len(ops) or ops[st.i].stage != locked_stage):
            st.holds_lock = False
            lock_held[0] = False
            if lock_queue:
                waiter = lock_queue.popleft()
                lock_held[0] = waiter.holds_lock = True
                advance(waiter, t)

    def finish_op(st: _State, ready: float, t: float) -> None:
        op = st.job.ops[st.i]
        st.ops.append((st.i, ready, ready, t))
        if op.chunk:
            st.chunks.append(t)
        st.i += 1
        release_lock(st, t)
        advance(st, t, io=op.kind != "thread")

    if clients is None:
        for job in jobs:
            push(job.arrival_ms, "arrive", job)
        pending.clear()
    else:
        for k in range(min(clients, len(pending))):
            push(k * ramp_ms, "arrive", pending.popleft())
    while events:
        t, _, what, arg = heapq.heappop(events)
        if what == "arrive":
            advance(_State(arg, t), t, io=True)
        elif what == "step_done":
            st, j = arg
            st.i = j
            release_lock(st, t)
            advance(st, t)
            serve_loop(t)
        elif what == "model_done":
            st, ready, name = arg
            busy[name] -= 1
            if queued[name]:
                nxt, at = queued[name].popleft()
                busy[name] += 1
                push(t + nxt.job.ops[nxt.i].ms, "model_done", (nxt, at, name))
            finish_op(st, ready, t)
        else:  # op_done
            st, ready = arg
            finish_op(st, ready, t)
    return sorted((_record(st) for st in done), key=lambda r: r.start_ns)


def _record(st: _State) -> RequestRecord:
    """What tracekit's core records for one simulated request."""
    job = st.job
    req_id = _span_id()
    by_stage: dict[str, list[tuple[Op, float, float, float]]] = {}
    own: list[tuple[Op, float, float, float]] = []
    for index, ready, start, end in st.ops:
        op = job.ops[index]
        (by_stage.setdefault(op.stage, []) if op.stage else own).append((op, ready, start, end))
    end_ms = max((e for *_, e in st.ops), default=st.start)
    # The server span starts when the request's first step runs (the middleware's code),
    # after any wait for the loop: that wait is not part of the recorded latency.
    first = st.ops[0] if st.ops else None
    start_ms = first[2] if first is not None and job.ops[first[0]].kind in _ON_LOOP else st.start
    request_waits: list[tuple[float, float]] = []
    stages: list[StageRecord] = []
    for name, ops in by_stage.items():
        first = ops[0]
        # A stage starts when its code is entered: for an on-loop first op, once the loop
        # runs it (the caller waited for the loop); otherwise when the previous op ended.
        s_start = first[2] if first[0].kind in _ON_LOOP else first[1]
        if first[0].kind in _ON_LOOP and first[2] > first[1]:
            request_waits.append((first[1], first[2]))
        loop_waits = [(r, s) for op, r, s, _ in ops[1:] if op.kind in _ON_LOOP and s > r]
        on_loop = not any(op.kind == "thread" for op, *_ in ops)
        runs = _runs([(s, e) for op, _, s, e in ops if op.kind in _ON_LOOP])
        attrs = dict(job.attributes.get(name, {}))
        # Other code ran inside the stage's interval: an async generator whose consumer held
        # its items (the core's tracekit.consumer_ms).
        own_time = sum(e - (s if op.kind in _ON_LOOP else r) for op, r, s, e in ops)
        own_time += sum(b - a for a, b in loop_waits)
        consumer = (ops[-1][3] - s_start) - own_time
        if consumer > 1e-6:
            attrs[semconv.CONSUMER_MS] = consumer
        stages.append(
            stage(
                name,
                s_start,
                ops[-1][3],
                kind=job.kinds.get(name),
                cpu_ms=sum(e - s for op, _, s, e in ops if op.kind in ("cpu", "thread")),
                # Blocked off-CPU in a sync call counts as wait, like the core's ledger.
                wait_ms=sum(e - r for op, r, _, e in ops if op.kind in ("wait", "model", "block")),
                loop_wait_ms=sum(b - a for a, b in loop_waits),
                on_loop=on_loop,
                max_block_ms=max((b - a for a, b in runs), default=0.0),
                slices=[r for r in runs if r[1] - r[0] >= 1.0],
                waits=[w for w in loop_waits if w[1] - w[0] >= 1.0],
                parent=req_id,
                attributes=attrs,
            )
        )
    for op, ready, start, _ in own:
        if op.kind in _ON_LOOP and start > ready:
            request_waits.append((ready, start))
    # The wait for the loop before the first step is before the span starts: not recorded.
    request_waits = [w for w in request_waits if w[0] >= start_ms]
    # Every step is a resumption of the request's coroutine: the core's request ledger
    # records it whole, covering the sync stages called inside it.
    request_slices = [(a, b) for a, b in st.steps if b - a >= 1.0]
    cpu_total = sum(e - s for i, _, s, e in st.ops if job.ops[i].kind in ("cpu", "thread"))
    loop_wait_total = sum(b - a for a, b in request_waits) + sum(
        s.loop_wait_ms or 0.0 for s in stages
    )
    extra: dict[str, Any] = {}
    if st.chunks:
        gaps = [b - a for a, b in itertools.pairwise(st.chunks)]
        extra["ttft_ms"] = st.chunks[0] - start_ms
        extra["chunks"] = len(st.chunks)
        if gaps:
            extra["itl_p50_ms"] = percentile(gaps, 0.5)
            extra["itl_p95_ms"] = percentile(gaps, 0.95)
            extra["itl_max_ms"] = max(gaps)
            extra["tpot_ms"] = (st.chunks[-1] - st.chunks[0]) / (len(st.chunks) - 1)
    return request(
        job.route,
        start_ms,
        end_ms,
        stages,
        span_id=req_id,
        cpu_ms=cpu_total,
        loop_wait_ms=loop_wait_total,
        slices=request_slices,
        waits=[w for w in request_waits if w[1] - w[0] >= 1.0],
        **extra,
    )


def _runs(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merge back-to-back intervals (one step running several ops of the stage)."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and abs(a - out[-1][1]) < 1e-9:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out
