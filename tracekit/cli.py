"""The ``tracekit`` command line (DESIGN §5).

::

    tracekit analyze SOURCE [--format text|json|html] [-o FILE] [--route R] [--slo SPEC]
                            [--fail-on high|medium|low]
    tracekit analyze --jaeger URL --service NAME [--lookback 1h] [--limit N]
                     [--timeout SECONDS] [--max-response-mb MB] [...]

Exit codes: 0 done; 1 a finding at or above ``--fail-on`` exists (CI gate); 2 bad input or
usage (one line on stderr, ``tracekit: error: ...``, never a traceback); 3 an internal error
(one line; ``TRACEKIT_DEBUG=1`` shows the traceback); 130 interrupted; 141 the reader of
stdout went away (``| head``).

Each subcommand is one ``add_*_command(subparsers)`` function that registers its parser and
sets ``handler``, so a new one is a function and a line in :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn, TextIO

from tracekit.errors import ConfigurationError, TracekitError

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_ERROR = 2
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
SEVERITIES = ("high", "medium", "low")
_MAX_ERROR_CHARS = 500


class _UsageError(Exception):
    """argparse refused the command line (message already one line)."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, raised rather than printed and exited."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{message} (see '{self.prog} --help')")


def add_analyze_command(subparsers: argparse._SubParsersAction[_Parser]) -> None:
    """Register ``tracekit analyze``.

    Args:
        subparsers: the object ``ArgumentParser.add_subparsers`` returned.
    """
    p = subparsers.add_parser(
        "analyze",
        help="find what is slow in traces and what fixes it",
        description="Analyse OTLP JSON(L) or Jaeger JSON trace files, or a Jaeger query API.",
    )
    p.add_argument("source", nargs="?", help="trace file (OTLP JSON, JSON Lines, Jaeger JSON)")
    p.add_argument(
        "--jaeger", metavar="URL", help="Jaeger query API base URL, e.g. http://localhost:16686"
    )
    p.add_argument("--service", help="service to query (with --jaeger)")
    p.add_argument(
        "--lookback", default="1h", help="how far back to query (with --jaeger; default 1h)"
    )
    p.add_argument("--limit", type=_positive_int, help="most traces to fetch (with --jaeger)")
    p.add_argument(
        "--timeout",
        type=_positive_float,
        metavar="SECONDS",
        help="deadline for the whole Jaeger query (with --jaeger; default 60)",
    )
    p.add_argument(
        "--max-response-mb",
        type=_positive_float,
        metavar="MB",
        help="largest Jaeger answer read, in MiB (with --jaeger; default 256)",
    )
    p.add_argument(
        "--format",
        choices=("text", "json", "html"),
        default="text",
        help="output format (default text)",
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write the report here (atomically) instead of stdout",
    )
    p.add_argument("--route", help="analyse only this route ('POST /v1/chat' or '/v1/chat')")
    p.add_argument(
        "--slo", metavar="SPEC", help="latency targets for goodput, e.g. ttft=500ms,itl=50ms,e2e=5s"
    )
    p.add_argument(
        "--fail-on",
        choices=SEVERITIES,
        help="exit 1 when a finding at or above this severity exists",
    )
    p.set_defaults(handler=_run_analyze)


#: Subcommand registrars, in help order.
COMMANDS: list[Callable[[argparse._SubParsersAction[_Parser]], None]] = [add_analyze_command]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tracekit")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> _Parser:
    """The ``tracekit`` argument parser with every command of :data:`COMMANDS`."""
    parser = _Parser(
        prog="tracekit", description="What exactly is slow on an LLM gateway's request path."
    )
    parser.add_argument("--version", action="version", version=f"tracekit {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in COMMANDS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: arguments without the program name; ``None`` reads ``sys.argv``.

    Returns:
        The exit code (see the module docstring).
    """
    try:
        try:
            try:
                args = build_parser().parse_args(argv)
            except SystemExit as exc:  # --help, --version: argparse printed and exits 0
                return exc.code if isinstance(exc.code, int) else EXIT_OK
            if getattr(args, "handler", None) is None:
                raise _UsageError("missing command (see 'tracekit --help')")
            code: int = args.handler(args)
            return code
        finally:
            # Flushing here turns a late broken pipe into the BrokenPipeError handled below.
            sys.stdout.flush()
    except (_UsageError, TracekitError) as exc:
        return _fail(str(exc), EXIT_ERROR)
    except KeyboardInterrupt:
        return _fail("interrupted", EXIT_INTERRUPTED)
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except Exception as exc:
        if os.environ.get("TRACEKIT_DEBUG"):
            traceback.print_exc()
        return _fail(
            f"internal error: {type(exc).__name__}: {exc} (set TRACEKIT_DEBUG=1 for details)",
            EXIT_INTERNAL,
        )


def _fail(message: str, code: int) -> int:
    line = " ".join(message.split())
    if len(line) > _MAX_ERROR_CHARS:  # an exception text can quote megabytes of input
        line = line[: _MAX_ERROR_CHARS - 3] + "..."
    with contextlib.suppress(OSError):
        print(f"tracekit: error: {line}", file=sys.stderr)
    return code


def _silence_stdout() -> None:
    # Python flushes stdout again at exit; pointing it at devnull keeps that from raising.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text}")
    return value


def _run_analyze(args: argparse.Namespace) -> int:
    from tracekit.analysis.api import analyze

    if (args.source is None) == (args.jaeger is None):
        raise _UsageError(
            "give a trace file or --jaeger URL (exactly one) (see 'tracekit analyze --help')"
        )
    if args.jaeger is not None and not args.service:
        raise _UsageError("--jaeger needs --service NAME (see 'tracekit analyze --help')")
    source = args.source if args.source is not None else args.jaeger
    report = analyze(
        source,
        route=args.route,
        slo=args.slo,
        service=args.service,
        lookback=args.lookback,
        limit=args.limit,
        timeout=args.timeout,
        max_response_mb=args.max_response_mb,
    )
    for warning in report.warnings:
        print(f"tracekit: warning: {' '.join(warning.split())}", file=sys.stderr)
    if args.format == "json":
        text = report.to_json() + "\n"
    elif args.format == "html":
        text = report.to_html()
    else:
        text = report.to_text(
            width=None if args.output is None else 100, color=False if args.output else None
        )
    if args.output is None:
        _write_stdout(text)
    else:
        write_atomic(args.output, text)
    if args.fail_on is not None and _reaches(report.worst_severity(), args.fail_on):
        return EXIT_FINDINGS
    return EXIT_OK


def _write_stdout(text: str, stream: TextIO | None = None) -> None:
    out = stream if stream is not None else sys.stdout
    try:
        out.write(text)
    except UnicodeEncodeError:
        # A stream that cannot encode trace text (an ASCII console): escape, don't crash.
        out.write(
            text.encode(out.encoding or "ascii", "backslashreplace").decode(out.encoding or "ascii")
        )


def _reaches(worst: str | None, threshold: str) -> bool:
    return worst is not None and SEVERITIES.index(worst) <= SEVERITIES.index(threshold)


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one.

    Args:
        path: the destination.
        text: the content (UTF-8).

    Raises:
        ConfigurationError: the file cannot be written (missing directory, permissions).
    """
    target = os.path.abspath(path)
    directory = os.path.dirname(target)
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tracekit-", suffix=".tmp")
    except OSError as exc:
        raise ConfigurationError(f"cannot write {path}: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        # mkstemp makes the file 0600; give it the mode a plain open() would have.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise ConfigurationError(f"cannot write {path}: {exc.strerror or exc}") from exc
        raise
