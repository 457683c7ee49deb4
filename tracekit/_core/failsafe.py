"""Tracing must never change what the application does (DESIGN §1).

tracekit's own failures go through :func:`internal_error`: logged once per place, with the
traceback, and swallowed. Nothing here ever raises into a request.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("tracekit")
_reported: set[str] = set()


def internal_error(where: str) -> None:
    """Log the exception being handled, once per ``where``, and swallow it."""
    if where in _reported:
        return
    _reported.add(where)
    try:
        logger.exception("tracekit internal error in %s (tracing only; the request goes on)", where)
    except Exception:  # logging itself broken: nothing more we can do, and nothing to raise
        pass
