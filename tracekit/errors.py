"""tracekit's exceptions.

::

    TracekitError                 base of everything tracekit raises on purpose
    ├── ConfigurationError        bad argument or setting (also a ValueError)
    └── SourceError               a trace source could not be read
        ├── SourceNotFoundError   missing file, unreachable or failing Jaeger query API
        └── TraceFormatError      not JSON, truncated JSON, neither OTLP nor Jaeger

The CLI catches :class:`TracekitError` once and prints its message as one line (exit 2).
Readers translate ``json``/``orjson``/HTTP errors into these with ``raise ... from exc``.
Tracing itself (middleware, stages, export) never raises into a request: its own failures are
logged once and swallowed.
"""

from __future__ import annotations


class TracekitError(Exception):
    """Base class of every error tracekit raises on purpose."""


class ConfigurationError(TracekitError, ValueError):
    """A bad argument or setting, e.g. an unknown exporter name."""


class SourceError(TracekitError):
    """A trace source could not be read."""


class SourceNotFoundError(SourceError):
    """The file does not exist, or the Jaeger query API is unreachable or answered an error."""


class TraceFormatError(SourceError):
    """The input is not a trace file tracekit can read (not JSON, truncated, unknown shape)."""
