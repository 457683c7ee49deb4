"""The fixes of the loop rules (``loop-saturated``, ``gc-pauses``, ``background-on-loop``) as
``(title, code)``, written with the figures that chose them. Trace text in code goes through
:func:`tracekit.analysis.rules.fixes._literal`-style quoting or into comments, whose lines it
cannot end (newlines are replaced)."""

from __future__ import annotations

from collections.abc import Sequence


def _comment(text: str) -> str:
    """Trace text for a ``#`` comment: one line."""
    return " ".join(text.split())


def more_workers(workers: int, now: int, rho: float, rho_after: float) -> tuple[str, str]:
    """More worker processes: each has its own event loop (and GIL)."""
    title = (
        f"Run {workers} worker processes (one core each): one event loop is one core's worth "
        f"of Python, and this one was {rho:.0%} busy with {now}"
    )
    code = f"""# each worker process has its own event loop and GIL: the load splits {workers} ways
# (the loop: {rho:.0%} busy with {now} -> about {rho_after:.0%} with {workers})
uvicorn app:app --workers {workers}
# or, under gunicorn:
gunicorn app:app -k uvicorn.workers.UvicornWorker --workers {workers}
# or, under hypercorn:
hypercorn app:app --workers {workers}
"""
    return title, code


def freeze_after_startup(longest_ms: float, generation: int) -> tuple[str, str]:
    """``gc.freeze()`` once start-up is done: full collections stop scanning what it built."""
    title = (
        "Freeze what start-up built (gc.freeze() in the lifespan hook) so that full "
        "collections stop walking it; then allocate less per request"
    )
    code = f"""import gc
from contextlib import asynccontextmanager

@asynccontextmanager
async def lifespan(app):
    ...  # load models, tokenizers, clients, routes: what lives as long as the process
    gc.collect()  # collect start-up garbage once, then
    gc.freeze()   # move every object alive now to a permanent generation: a full collection
                  # (the longest here: {longest_ms:.0f} ms of CPU, generation {generation}) no longer walks it
    yield

app = FastAPI(lifespan=lifespan)
"""
    return title, code


def fewer_collections(longest_ms: float, generation: int, young: int) -> tuple[str, str]:
    """A higher generation-0 threshold: fewer young collections, and fewer promotions."""
    title = (
        "Collect less often (gc.set_threshold with a higher generation-0 threshold) and "
        "allocate less per request"
    )
    code = f"""import gc

# {young} young (generation 0 and 1) collections ran on the loop thread; the longest took
# {longest_ms:.1f} ms of CPU (generation {generation}). A 10x higher generation-0 threshold makes
# them 10x rarer (each a little longer); gc.freeze() after start-up shortens all of them.
gen0, gen1, gen2 = gc.get_threshold()
gc.set_threshold(gen0 * 10, gen1, gen2)
"""
    return title, code


def background_off_loop(per_second_ms: float, tasks: int | None,
                        named: Sequence[tuple[str, float]] = ()) -> tuple[str, str]:  # fmt: skip
    """Find and move the work no request owns (logging, billing, metrics, periodic tasks);
    ``named``: the background tasks that took the most of it, ``(coroutine, ms per second)``."""
    if named:
        title = (
            f"Move {_comment(named[0][0])}'s work off the loop (the background task that took the most of "
            "it): its CPU-bound part in a thread or process, or batched; logging through a "
            "QueueHandler thread"
        )
    else:
        title = (
            "Find the loop's untraced work (a profiler, or tracekit.stage around background "
            "tasks) and move it off the loop: logging through a QueueHandler thread, billing and "
            "metrics batched or in a thread"
        )
    tasks_line = f", up to {tasks} tasks alive" if tasks is not None else ""
    code = f"""# {per_second_ms:.0f} ms of every second on the loop ran no traced request{tasks_line}.
"""
    for name, ms in named:
        code += f"#   task {_comment(name)}: {ms:.0f} ms a second\n"
    code += """# 1. See it: name background tasks as stages, so the report attributes their CPU
@tracekit.stage("billing")
async def record_usage(usage): ...

# 2. Logging on the loop thread formats and writes synchronously: hand records to a thread
import logging, logging.handlers, queue
records = queue.SimpleQueue()
handlers = logging.getLogger().handlers
logging.getLogger().handlers = [logging.handlers.QueueHandler(records)]
logging.handlers.QueueListener(records, *handlers).start()

# 3. Per-request callbacks (billing, metrics export): batch them, or run them in a thread
await asyncio.to_thread(flush_usage, batch)
"""
    return title, code
