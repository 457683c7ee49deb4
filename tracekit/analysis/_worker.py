"""The worker side of the parallel reader (:mod:`tracekit.analysis._parallel`): one byte range.

A worker is a fresh interpreter started by the parent with three inherited descriptors: its
connection to the parent, the pipe from the previous range's worker and the pipe to the
next one's. It reads its range (the typed fast path), assembles and aggregates it, sets aside
the traces it first sees within ``Window.reach`` spans of its start, assembles them once the
previous worker's end state arrives, hands its own end state on, and answers the parent.

Cost: the range's spans (a CPU's share of the file), plus the set-aside spans, assembled
after the range; memory: the open traces, the statistics, a packed sample.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

from tracekit.analysis._jaeger_json import jaeger_spans
from tracekit.analysis._otlp_json import otlp_spans
from tracekit.analysis._otlp_typed import typed_spans
from tracekit.analysis._packing import pack, unpack
from tracekit.analysis._parallel import BATCH_SPANS, Partial, Plan, Settings, State
from tracekit.analysis._source_common import ReadStats
from tracekit.analysis.assembly.grouping import Window
from tracekit.analysis.assembly.request_records import route_matches
from tracekit.analysis.model import RequestRecord, Span
from tracekit.analysis.stats.aggregate import Aggregator
from tracekit.errors import TracekitError

__all__ = ["worker_main"]

_BUFFER = 4 * 2**20


def worker_main(argv: list[str]) -> None:
    """Entry point of a worker process: ``PARENT_FD PREVIOUS_FD FOLLOWING_FD`` (-1: none)."""
    parent_fd, previous_fd, following_fd = (int(arg) for arg in argv)
    parent = Connection(parent_fd)
    previous = Connection(previous_fd, writable=False) if previous_fd >= 0 else None
    following = Connection(following_fd, readable=False) if following_fd >= 0 else None
    plan, k, settings = parent.recv()
    _work(plan, k, settings, previous, following, parent)


def _work(
    plan: Plan,
    k: int,
    settings: Settings,
    previous: Connection | None,
    following: Connection | None,
    parent: Connection,
) -> None:
    import gc

    gc.disable()  # as analyze() does: millions of acyclic objects, see api._gc_paused
    worker = _Worker(plan, k, settings)
    handed_on = False
    try:
        worker.read()
        if following is None:
            # The file ends with this range: its own traces are flushed now, which frees the
            # window before the neighbour's state arrives (they never meet the set-aside ones).
            worker.finish(worker.window)
        try:
            state = previous.recv_bytes() if previous is not None else pack(([], {}))
        except EOFError:
            state = b""
        if not state:  # the previous range failed: its error is the one reported
            raise _Abandoned
        worker.assemble_set_aside(state)
        if following is not None:
            handed_on = True
            # A neighbour that failed has gone: its own error is what gets reported.
            with contextlib.suppress(OSError):
                following.send_bytes(pack(worker.end_state()))
        else:
            worker.finish(worker.sim)
        kept = worker.aggregator.take_sample()
        parent.send(("ok", worker.partial([key for key, _ in kept])))
        cutoff = parent.recv()
        parent.send(("sample", [packed for key, packed in kept if cutoff is None or key >= cutoff]))
    except (EOFError, OSError) as exc:
        # The parent stopped listening (another range failed): leave quietly. A file that
        # cannot be read is a TracekitError by now (sources._guard), not an OSError.
        _tell(parent, ("crash", f"{type(exc).__name__}: {exc}"))
    except _Abandoned:
        _tell(parent, ("abandoned", None))
    except TracekitError as exc:
        _tell(parent, ("error", exc))
    except BaseException:
        _tell(parent, ("crash", traceback.format_exc()))
    finally:
        if following is not None and not handed_on:
            with contextlib.suppress(OSError):
                following.send_bytes(b"")


def _tell(connection: Connection, message: Any) -> None:
    with contextlib.suppress(OSError):
        connection.send(message)


class _Abandoned(Exception):
    pass


class _Worker:
    """One byte range: read, assemble (setting aside traces near its start), aggregate."""

    def __init__(self, plan: Plan, k: int, settings: Settings) -> None:
        self.plan = plan
        self.k = k
        self.settings = settings
        self.stats = ReadStats(format="otlp-jsonl")
        self.aggregator = Aggregator(
            slo=settings.slo, sample_size=settings.sample_size, pack_sample=True
        )
        self.window = Window(settings.max_open_traces, settings.flush_after)
        self.sim = Window(settings.max_open_traces, settings.flush_after)
        self.spans = 0
        self.services: dict[str, None] = {}
        self.matched: dict[str, None] = {}
        self.others: dict[str, None] = {}
        self.reach = self.window.reach if k > 0 else 0
        self.head: set[str] = set()
        self.set_aside: list[tuple[int, Span]] = []
        self.set_aside_packed: list[bytes] = []
        self._first_line: int | None = None

    def read(self) -> None:
        """Read, assemble and aggregate the range (as far as it does not need its neighbour)."""
        from tracekit.analysis.sources import _guard

        batch: list[Span] = []
        for spans in _guard(self._lines(), self.plan.name):
            batch.extend(spans)
            if len(batch) >= BATCH_SPANS:
                self._assemble(batch)
                batch = []
        self._assemble(batch)

    def _assemble(self, batch: list[Span]) -> None:
        for req in self.window.run(self._positioned(batch)):
            self._add(req)
        self._pack_set_aside()

    def _pack_set_aside(self) -> None:
        # Set-aside spans wait packed (a third of the memory of the objects).
        if self.set_aside:
            self.set_aside_packed.append(pack(self.set_aside))
            self.set_aside = []

    def _positioned(self, batch: list[Span]) -> Iterator[tuple[int, Span | None]]:
        n = self.spans
        services = self.services
        head = self.head
        reach = self.reach
        limit = self.settings.max_services
        last: str | None = None
        for span in batch:
            n += 1
            service = span.service
            if service is not last:  # the spans of a line share their service's string
                last = service
                if service and service not in services and len(services) < limit:
                    services[service] = None
            if reach:
                # A trace first seen within reach of the range's start may continue one of
                # the previous range: all its spans wait for that range's end state.
                trace_id = span.trace_id
                if n <= reach:
                    head.add(trace_id)
                if trace_id in head:
                    self.set_aside.append((n, span))
                    yield n, None
                    continue
            yield n, span
        self.spans = n

    def _add(self, req: RequestRecord) -> None:
        route = self.settings.route
        if route is None or route_matches(req.route, route):
            self.matched[req.route] = None
            self.aggregator.add(req)
        else:
            if len(self.others) < self.settings.routes_quoted:
                self.others[req.route] = None
            self.aggregator.add(req, counted=False)

    def assemble_set_aside(self, state: bytes) -> None:
        """Assemble the set-aside spans on the previous range's end state (packed)."""
        adopted: State = unpack(state, State)
        self.sim.adopt(*adopted)
        self._pack_set_aside()
        for packed in self.set_aside_packed:
            for req in self.sim.run(unpack(packed, list[tuple[int, Span]])):
                self._add(req)
        self.set_aside_packed = []
        end = self.spans + 1
        for window in (self.window, self.sim):
            for req in window.sweep(end):
                self._add(req)

    def end_state(self) -> State:
        """The open traces and remembered flushes, in the next range's positions."""
        groups, flushed = self.window.state(self.spans)
        more_groups, more_flushed = self.sim.state(self.spans)
        for trace_id, at in more_flushed.items():
            flushed[trace_id] = max(at, flushed.get(trace_id, at))
        return groups + more_groups, flushed

    def finish(self, window: Window) -> None:
        """The file ends here: flush every trace ``window`` holds."""
        for req in window.finish():
            self._add(req)

    def partial(self, sample_keys: list[Any]) -> Partial:
        return Partial(
            self.aggregator,
            self.stats,
            self.spans,
            list(self.services),
            list(self.matched),
            list(self.others),
            sample_keys,
        )

    # --- reading ---------------------------------------------------------------------------
    def _lines(self) -> Iterator[list[Span]]:
        # A buffer that holds whole lines (~500 kB each): readline then costs a fifth of the
        # default 8 kB buffer's, which gathers a long line piece by piece. (A memory map
        # would be cheaper still, but the pages of the file it touches count in the RSS.)
        from tracekit.analysis.sources import _is_cut_short

        start, end = self.plan.bounds[self.k], self.plan.bounds[self.k + 1]
        with open(self.plan.path, "rb", buffering=_BUFFER) as file:
            file.seek(start)
            at = start
            for index, line in enumerate(file):
                size = len(line)
                if not line.isspace():
                    if at == 0:
                        line = line.removeprefix(b"\xef\xbb\xbf")
                    spans = typed_spans(line)
                    if spans is None:
                        if _is_cut_short(line):  # the file's last line, still being written
                            self.stats.cut_tail_bytes = size
                            return
                        spans = self._generic(line, index)
                    yield spans
                at += size
                if at >= end:
                    return

    def _generic(self, line: bytes, index: int) -> list[Span]:
        # As sources._file_spans does for a line the fast path leaves: parse, detect, read.
        from tracekit.analysis.sources import _family, _guard, _parse

        where = f"{self.plan.name}: line {self._line_number(index)}"
        name = self.plan.name

        def spans() -> Iterator[Span]:
            doc = _parse(line, where)
            if _family(doc, where) == "otlp":
                yield from otlp_spans(doc, self.stats, where)
            else:
                yield from jaeger_spans(doc, self.stats, where)

        return list(_guard(spans(), name))

    def _line_number(self, index: int) -> int:
        if self._first_line is None:
            start = self.plan.bounds[self.k]
            newlines = 0
            with open(self.plan.path, "rb") as file:
                while file.tell() < start:
                    chunk = file.read(min(2**22, start - file.tell()))
                    if not chunk:
                        break
                    newlines += chunk.count(b"\n")
            self._first_line = newlines + 1
        return self._first_line + index
