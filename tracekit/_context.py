"""Context variables binding work to its request and its parent stage.

One variable: the innermost open ledger (a stage, or the request's own root ledger). Child
tasks (``asyncio.gather``, TaskGroup) and worker threads (``asyncio.to_thread``, anyio's
``to_thread.run_sync``) copy the context when they start, so stages inside them find their
parent and request without any help.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tracekit._accounting import Ledger

current_ledger: ContextVar[Ledger | None] = ContextVar("tracekit.current_ledger", default=None)
