"""What is current: the innermost open ledger (per task and thread) and the runtime recording.

One variable: the innermost open ledger (a stage, or the request's own root ledger). Child
tasks (``asyncio.gather``, TaskGroup) and worker threads (``asyncio.to_thread``, anyio's
``to_thread.run_sync``) copy the context when they start, so stages inside them find their
parent and request without any help.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tracekit._core.ledger import Ledger

current_ledger: ContextVar[Ledger | None] = ContextVar("tracekit.current_ledger", default=None)
# Its methods, bound once: the hot path calls them for every stage, and a call through a
# bound method skips the attribute lookup (most of the cost in compiled code).
get_ledger: Callable[[], Ledger | None] = current_ledger.get
set_ledger: Callable[[Ledger | None], Token[Ledger | None]] = current_ledger.set
reset_ledger: Callable[[Token[Ledger | None]], None] = current_ledger.reset

#: The runtime finished requests go to (sampling, span building, export): a
#: :class:`tracekit._export.tracing.Runtime`, installed by ``configure()`` or ``record()``
#: (:func:`tracekit._export.tracing.install`); None while nothing records.
active_runtime: Any = None
