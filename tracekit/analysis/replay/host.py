"""The replay's model statement: the gateway host it assumes, the arrivals it replays, and the
range it gives around a projection.

**Cores.** GIL-free work runs on up to ``cores`` CPUs, and asyncio's default thread pool has
``min(32, cpus + 4)`` workers, both on the *gateway host*, not the machine running the
analyzer. The recorder writes them on its resource (``tracekit.process.cpus``: the CPUs the
process may run on; ``tracekit.host.cpus``: the machine's); the readers copy them onto the
request spans. Precedence: ``ReplayConfig(cores=...)`` (``tracekit analyze --cores N``), else
the trace, else this machine's (said so in the statement).

**The host's other load.** A gateway host runs more than the gateway (a load generator, other
services, noisy neighbours). The loop windows measure how long the loop thread waited for a
CPU while ready to run (Linux: its run-queue delay); the share of a CPU it got while ready,
``s = cpu / (cpu + run-queue delay)``, says how many other threads were runnable. Their
number at an instant is taken as Poisson with mean ``others`` (:mod:`~.sim`: fair sharing of
``cores`` between runnable threads, averaged over that number), and ``others`` is the mean
under which a lone thread gets ``s`` (:func:`others_of`). A thread a fix adds beside the loop
then gets less of a core than the loop had alone: on 2 cores, 0.78 of it where ``s`` was 0.72,
0.83 where it was 0.92. Without the measurement, or with ``--cores`` (the user says the cores
free for the gateway), ``others`` is 0: the cores are free. Limits: ``s`` is the recording's
average; the Poisson count stands for load from many independent sources, so a few threads
busy all the time (two CPU hogs) are read as lighter than they are; and the other processes'
demand is taken as fixed, where a load generator or a model server on the same host works
harder when the gateway gets faster.

**Range.** The after figure is the replay's central estimate. Its range covers two
uncertainties, both read from the trace: the sampling error of a percentile of the
replayed requests (a distribution-free 95% interval from the order statistics: the
ranks ``n q ± 1.96 sqrt(n q (1 - q))``), and the model's own error on this route as
recorded (the validation's residual: when the as-recorded replay came out 6% short, the
after may be 6% off too, either way: :func:`widen`). Throughput: the
residual of the as-recorded throughput, and a count's sampling error (``1.96 / sqrt(n)``).
On a host short of CPU (``Host.short``), a fix that moves CPU to a thread or a process is
replayed a second time with that work winning no CPU from the host
(:func:`~tracekit.analysis.replay.fixes.no_cpu_won`), and the range reaches that replay's
intervals too: the fair sharing above gave such work more of a busy host than the kernel did.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tracekit import semconv
from tracekit.analysis.model import RequestRecord
from tracekit.analysis.replay.sim import lone_rate
from tracekit.analysis.stats.loop_windows import LoopCpu

#: Where the cores came from, as the statement says it.
FROM_OPTION = "--cores"
FROM_TRACE = "trace"
FROM_MACHINE = "this machine"
_Z95 = 1.96
#: A loop thread that got almost no CPU (a share under cores / 501): the reading stops here,
#: where a Poisson term still has a positive float (e^-745 underflows to 0).
_MAX_OTHERS = 500.0


@dataclass(frozen=True)
class Host:
    """The gateway host the replay assumes for one service.

    Attributes:
        cores: CPUs the process may use (GIL-free work runs on up to this many).
        source: :data:`FROM_OPTION`, :data:`FROM_TRACE` or :data:`FROM_MACHINE`.
        machine_cpus: the host's logical CPUs when the trace says (asyncio sizes its
            default thread pool from them), else ``None``.
        thread_pool_size: workers of asyncio's default executor in the model.
        others: the host's other runnable threads, on average (0: the cores are free).
        loop_cpu_share: the share of a CPU the loop thread got while ready to run, where the
            trace measured it (what ``others`` was read from), else ``None``.
        short: the host was short of CPU (:attr:`LoopCpu.host_short
            <tracekit.analysis.stats.loop_windows.LoopCpu.host_short>`): a fix that moves CPU
            off the loop may win none of it (the range's far end:
            :func:`~tracekit.analysis.replay.fixes.no_cpu_won`).
    """

    cores: int
    source: str
    machine_cpus: int | None
    thread_pool_size: int
    others: float = 0.0
    loop_cpu_share: float | None = None
    short: bool = False

    @property
    def cpu_wait(self) -> float:
        """ms the loop thread waited for a CPU per ms of CPU it ran, from ``loop_cpu_share``
        (0 where not measured). A recorded slice holds this wait in its wall time; the CPU of
        steps too short to be recorded as slices does not, and the replay adds it
        (:class:`~tracekit.analysis.replay.build.ProgramBuilder`)."""
        share = self.loop_cpu_share
        return 1.0 / share - 1.0 if share is not None and 0 < share < 1 else 0.0


def cpu_count(value: object) -> int | None:
    """A CPU count read from an attribute: a positive int (or its text, as
    ``OTEL_RESOURCE_ATTRIBUTES`` gives it), else ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        value = value.strip()
        if not value.isdigit():
            return None
        value = int(value)
    return value if isinstance(value, int) and 0 < value < 1 << 20 else None


def _recorded(reqs: Sequence[RequestRecord], key: str) -> int | None:
    # The most common value among the requests (a service's replicas may differ: the model
    # is one process, so one value, the typical one).
    counts: dict[int, int] = {}
    for req in reqs:
        value = cpu_count(req.attributes.get(key))
        if value is not None:
            counts[value] = counts.get(value, 0) + 1
    return max(sorted(counts), key=lambda v: counts[v]) if counts else None


def host_of(reqs: Sequence[RequestRecord], cores: int | None, thread_pool_size: int | None,
            loop_cpu: LoopCpu | None = None) -> Host:  # fmt: skip
    """The :class:`Host` of one service's requests.

    Args:
        reqs: the service's replayed requests.
        cores: the configured cores (``None``: the trace's, else this machine's).
        thread_pool_size: the configured pool (``None``: asyncio's default on the host).
        loop_cpu: what the service's loop threads got of the host's CPU
            (:meth:`~tracekit.analysis.stats.loop_windows.LoopWindows.loop_cpu`), or ``None``
            where not measured. Not used with configured ``cores``.
    """
    machine = _recorded(reqs, semconv.HOST_CPUS)
    if cores is not None:
        found, source = cores, FROM_OPTION
    else:
        recorded = _recorded(reqs, semconv.PROCESS_CPUS) or machine
        if recorded is not None:
            found, source = recorded, FROM_TRACE
        else:
            found, source = os.cpu_count() or 1, FROM_MACHINE
    pool = thread_pool_size or min(32, (machine or found) + 4)
    if cores is not None or loop_cpu is None or not 0 < loop_cpu.share < 1:
        return Host(found, source, machine, pool)
    share = loop_cpu.share
    return Host(found, source, machine, pool, others_of(found, share), share, loop_cpu.host_short)


def others_of(cores: int, loop_cpu_share: float) -> float:
    """The mean number of the host's other runnable threads under which a lone thread gets
    ``loop_cpu_share`` of a CPU on ``cores`` (:func:`~tracekit.analysis.replay.sim.lone_rate`
    inverted by bisection: it falls as the others grow)."""
    low, high = 0.0, 1.0
    while lone_rate(cores, high) > loop_cpu_share and high < _MAX_OTHERS:
        low, high = high, min(high * 2, _MAX_OTHERS)
    for _ in range(50):
        mid = (low + high) / 2
        low, high = (mid, high) if lone_rate(cores, mid) > loop_cpu_share else (low, mid)
    return (low + high) / 2


def statement(host: Host, mode: str, clients: int, rate_rps: float, requests: int,
              tolerance: float, in_flight: dict[str, Any] | None = None,
              read_by: str | None = None, think_ms: float | None = None) -> dict[str, Any]:  # fmt: skip
    """The report's ``model`` object: what the replay assumed (``docs/analyzer.md``).

    ``in_flight`` (the recorded count: mean, max, dispersion) and ``read_by`` (what decided
    the arrivals: ``in flight``, ``think time``, ``chains`` or ``option``) say why the arrivals
    are what they are; ``think_ms``, the clients' think time where that read them.
    """
    arrivals: dict[str, Any] = (
        {"arrivals": "closed", "clients": clients}
        if mode == "closed"
        else {"arrivals": "open", "rate_rps": round(rate_rps, 3)}
    )
    if read_by is not None:
        arrivals["arrivals_read_by"] = read_by
    if think_ms is not None:
        arrivals["think_ms"] = round(think_ms, 1)
    if in_flight is not None:
        arrivals["in_flight"] = in_flight
    return {
        "method": "replay",
        **arrivals,
        "cores": host.cores,
        "cores_source": host.source,
        **(
            {}
            if host.loop_cpu_share is None
            else {"host_others": round(host.others, 2), "loop_cpu_share": round(host.loop_cpu_share, 3)}
        ),
        **({"host_short": True} if host.short else {}),
        "thread_pool_size": host.thread_pool_size,
        "event_loops": 1,
        "gil": True,
        "requests": requests,
        "tolerance": tolerance,
    }


def quantile_range(values: Sequence[float], q: float) -> tuple[float, float]:
    """A distribution-free 95% interval of the ``q``-quantile of ``values`` (order
    statistics: the binomial ranks ``n q ± 1.96 sqrt(n q (1 - q))``)."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return (math.nan, math.nan)
    spread = _Z95 * math.sqrt(n * q * (1 - q))
    lo = max(0, math.floor(n * q - spread) - 1)
    hi = min(n - 1, math.ceil(n * q + spread))
    return ordered[lo], ordered[hi]


def widen(interval: tuple[float, float], error: float) -> list[float]:
    """``interval`` widened by the model's relative ``error`` on the recorded trace
    (simulated / measured - 1) either way: ``[low / (1 + |error|), high * (1 + |error|)]``.

    The range is read against the replay's own before. The error is the share of the
    recorded latency the model missed (or added), and a fix can remove what it missed (loop
    waits of clients that fell into lock step) or bring as much that it does not model (a
    worker thread's smaller share of a busy host's CPU, a model server slowed by more
    concurrent calls): on the traces that validation runs kept, the measured change went
    either way (``bench/projection_checks.py``, docs/analyzer-rules.md "Checking the
    range")."""
    lo, hi = interval
    scale = 1.0 + abs(error)
    return [round(lo / scale, 3), round(hi * scale, 3)]


def throughput_range(after: float, error: float, count: int) -> list[float]:
    """The range of a projected throughput: the as-recorded replay's relative ``error``, and
    the sampling error of ``count`` requests."""
    noise = _Z95 / math.sqrt(count) if count > 0 else 0.0
    return widen((after * (1 - noise), after * (1 + noise)), error)
