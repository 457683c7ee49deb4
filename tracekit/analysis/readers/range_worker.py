"""A worker process of the parallel reader: one byte range of a file through the pipeline.

:mod:`tracekit.analysis.readers.parallel` starts one per range (``python -c`` running
:func:`worker_main`) and sends it the :class:`Plan`, its index and the settings. The worker
reads its range with the readers' line loop (:func:`tracekit.analysis.readers.files.json_lines`)
into a :class:`~tracekit.analysis.pipeline.Pipeline`, takes the end state of the previous
range's worker, assembles the spans it set aside on it, answers the parent (a
:class:`Partial`, then the part of its packed sample the parent asks for, in chunks), and hands its own
end state to the next range's worker. Errors go to the parent as messages; the first range in file
order that failed is the one reported.
"""

from __future__ import annotations

import contextlib
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import IO, Any

from tracekit.analysis.assembly.grouping import LeftOut
from tracekit.analysis.model import Span
from tracekit.analysis.pipeline import BATCH_SPANS, Pipeline, Settings
from tracekit.analysis.readers.common import ReadStats
from tracekit.analysis.readers.files import guard, json_lines
from tracekit.analysis.readers.packing import pack
from tracekit.analysis.stats.aggregate import Aggregator
from tracekit.errors import TracekitError

__all__ = ["BOM", "SAMPLE_CHUNK", "Partial", "Plan", "worker_main"]

# A worker's read buffer holds whole lines (~500 kB each from tracekit's exporter): reading
# a line is then one copy, where the default 8 kB buffer gathers it piece by piece.
_BUFFER_BYTES = 4 * 2**20
#: A UTF-8 byte order mark, skipped at the start of a file.
BOM = b"\xef\xbb\xbf"
#: Packed requests per message of a worker's sample (~1.2 kB each): pickled whole, the
#: ~20,000 of a range were one more copy of the sample in the worker and in the parent at
#: the moment the summed RSS peaks (docs/performance-analyzer.md).
SAMPLE_CHUNK = 1000


@dataclass(frozen=True)
class Plan:
    """Where the workers' byte ranges start and end (``bounds[k]`` .. ``bounds[k + 1]``)."""

    path: str
    name: str
    bounds: tuple[int, ...]


@dataclass
class Partial:
    """What a worker sends the parent once its range is done (the sample follows apart)."""

    aggregator: Aggregator
    stats: ReadStats
    spans: int
    services: list[str]
    matched: list[str]
    others: list[str]
    sample_keys: list[Any] = field(default_factory=list)
    left_out: LeftOut = field(default_factory=LeftOut)


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
    # Read the range into the pipeline, take the previous range's end state, answer the
    # parent (which unpacks this range's sample while later ranges are read), then hand
    # this range's end state on.
    import gc

    gc.disable()  # as analyze() does: millions of acyclic objects, see api._gc_paused
    pipeline = Pipeline(settings, pack_sample=True, continues=k > 0)
    stats = ReadStats(format="otlp-jsonl")
    handed_on = False
    # The previous range's end state is taken as soon as it is sent, by a thread (blocked in
    # the pipe read, it leaves the GIL to the reading): the previous worker then exits at
    # once, where its write would otherwise hold it, and its memory, until this range is read.
    received = _Receiver(previous) if previous is not None else None
    try:
        _read(plan, k, pipeline, stats)
        if following is None:
            # The file ends with this range: its own traces are flushed now, which frees the
            # window before the neighbour's state arrives (they never meet the set-aside ones).
            pipeline.finish()
        state = received.result() if received is not None else pack(([], {}))
        if not state:  # the previous range failed: its error is the one reported
            raise _Abandoned
        pipeline.continue_from(state)
        if following is not None:
            end_state = pack(pipeline.end_state())
        else:
            pipeline.finish()
        kept = pipeline.aggregator.take_sample()
        partial = Partial(
            pipeline.aggregator, stats, pipeline.spans, list(pipeline.services),
            list(pipeline.matched), list(pipeline.others), [key for key, _ in kept],
            pipeline.left_out,
        )  # fmt: skip
        parent.send(("ok", partial))
        cutoff = parent.recv()
        chosen = [packed for key, packed in kept if cutoff is None or key >= cutoff]
        for at in range(0, len(chosen), SAMPLE_CHUNK):  # pickled a chunk at a time
            parent.send(("sample", chosen[at : at + SAMPLE_CHUNK]))
        parent.send(("sample", None))  # the end of the sample
        if following is not None:
            handed_on = True
            # A neighbour that failed has gone: its own error is what gets reported.
            with contextlib.suppress(OSError):
                following.send_bytes(end_state)
    except (EOFError, OSError) as exc:
        # The parent stopped listening (another range failed): leave quietly. A file that
        # cannot be read is a TracekitError by now (files.guard), not an OSError.
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


class _Receiver:
    """The bytes of one message from a connection, received by a thread of their own
    (``b""`` when the sender closed it without sending)."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._data = b""
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        with contextlib.suppress(EOFError, OSError):
            self._data = self._connection.recv_bytes()

    def result(self) -> bytes:
        """The message, once it has come."""
        self._thread.join()
        return self._data


def _tell(connection: Connection, message: Any) -> None:
    with contextlib.suppress(OSError):
        connection.send(message)


class _Abandoned(Exception):
    pass


def _read(plan: Plan, k: int, pipeline: Pipeline, stats: ReadStats) -> None:
    # The range's lines through the readers' loop, into the pipeline in batches.
    start, end = plan.bounds[k], plan.bounds[k + 1]
    where = _LineNames(plan, start)
    batch: list[Span] = []
    with open(plan.path, "rb", buffering=_BUFFER_BYTES) as file:
        for spans in guard(json_lines(_range_lines(file, start, end), stats, where), plan.name):
            batch += spans
            if len(batch) >= BATCH_SPANS:
                pipeline.add(batch)
                batch = []
    pipeline.add(batch)


def _range_lines(file: IO[bytes], start: int, end: int) -> Iterator[bytes]:
    # From a line start to the first line start at or past ``end``.
    file.seek(start)
    at = start
    for line in file:
        size = len(line)
        yield line.removeprefix(BOM) if at == 0 else line
        at += size
        if at >= end:
            return


class _LineNames:
    """``NAME: line N`` for the line at an index of a range, for messages; N is counted from
    the start of the file (the newlines before the range) the first time one is asked for."""

    def __init__(self, plan: Plan, start: int) -> None:
        self.plan = plan
        self.start = start
        self.first: int | None = None

    def __call__(self, index: int) -> str:
        if self.first is None:
            newlines = 0
            with open(self.plan.path, "rb") as file:
                while file.tell() < self.start:
                    chunk = file.read(min(2**22, self.start - file.tell()))
                    if not chunk:
                        break
                    newlines += chunk.count(b"\n")
            self.first = newlines + 1
        return f"{self.plan.name}: line {self.first + index}"
