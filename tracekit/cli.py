"""The ``tracekit`` command line (DESIGN §5).

::

    tracekit analyze SOURCE [--format text|json|html] [-o FILE] [--route R] [--slo SPEC] [--cores N]
                            [--fail-on high|medium|low]
    tracekit analyze --jaeger URL --service NAME [--lookback 1h] [--limit N]
                     [--timeout SECONDS] [--max-response-mb MB] [...]
    tracekit analyze --phoenix URL [--project NAME] [--lookback 1h] [--timeout SECONDS]
                     [--max-response-mb MB] [...]
    tracekit compare BEFORE AFTER [--format text|json] [-o FILE] [--route R] [--cores N]
                     [--finding RULE[:STAGE]] [--confidence 0.95] [--service NAME] [...]

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
import stat
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn, TextIO
from urllib.parse import urlsplit

from tracekit.analysis.rules.findings import SEVERITIES, severity_at_least
from tracekit.errors import ConfigurationError, TracekitError
from tracekit.render.text import escape_controls

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_ERROR = 2
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
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
        description="Analyse OTLP JSON(L) or Jaeger JSON trace files, a Jaeger query API, or "
        "Arize Phoenix's REST API.",
    )
    p.add_argument("source", nargs="?", help="trace file (OTLP JSON, JSON Lines, Jaeger JSON)")
    p.add_argument(
        "--jaeger", metavar="URL", help="Jaeger query API base URL, e.g. http://localhost:16686"
    )
    p.add_argument("--service", help="service to query (with --jaeger)")
    p.add_argument(
        "--phoenix", metavar="URL", help="Arize Phoenix base URL, e.g. http://localhost:6006"
    )
    p.add_argument("--project", help="Phoenix project to read (with --phoenix; default 'default')")
    p.add_argument(
        "--lookback",  # None when not given: a file source refuses it even at its default
        help="how far back to query (with --jaeger or --phoenix; default 1h)",
    )
    p.add_argument("--limit", type=_positive_int, help="most traces to fetch (with --jaeger)")
    p.add_argument(
        "--timeout",
        type=_positive_float,
        metavar="SECONDS",
        help="deadline for the whole query (with --jaeger or --phoenix; default 60)",
    )
    p.add_argument(
        "--max-response-mb",
        type=_positive_float,
        metavar="MB",
        help="largest answer read, in MiB (with --jaeger; with --phoenix, all pages; "
        "default 256)",
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
        help="write the report here instead of stdout (a file is replaced atomically)",
    )
    p.add_argument("--route", help="analyse only this route ('POST /v1/chat' or '/v1/chat')")
    p.add_argument(
        "--slo", metavar="SPEC", help="latency targets for goodput, e.g. ttft=500ms,itl=50ms,e2e=5s"
    )
    p.add_argument(
        "--cores",
        type=_positive_int,
        help="CPU cores of the gateway host, for the projections (default: the trace's, "
        "else this machine's)",
    )
    p.add_argument(
        "--fail-on",
        choices=SEVERITIES,
        help="exit 1 when a finding at or above this severity exists",
    )
    p.set_defaults(handler=_run_analyze)


def add_compare_command(subparsers: argparse._SubParsersAction[_Parser]) -> None:
    """Register ``tracekit compare``.

    Args:
        subparsers: the object ``ArgumentParser.add_subparsers`` returned.
    """
    p = subparsers.add_parser(
        "compare",
        help="measured change between two runs, and the projections checked",
        description="Compare two runs' traces per route: the measured change with confidence "
        "intervals, and BEFORE's projections next to it (docs/analyzer.md).",
    )
    p.add_argument(
        "before", metavar="BEFORE", help="the traces before the change (a trace file or Jaeger URL)"
    )
    p.add_argument(
        "after", metavar="AFTER", help="the traces after the change (a trace file or Jaeger URL)"
    )
    p.add_argument(
        "--format", choices=("text", "json"), default="text", help="output format (default text)"
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write the comparison here instead of stdout (a file is replaced atomically)",
    )
    p.add_argument("--route", help="compare only this route ('POST /v1/chat' or '/v1/chat')")
    p.add_argument(
        "--finding",
        metavar="RULE[:STAGE]",
        help="the fix that was made, among BEFORE's findings (default: each route's top "
        "finding with a projection)",
    )
    p.add_argument(
        "--confidence",
        type=_positive_float,
        default=0.95,
        help="the confidence intervals' coverage, 0.5 to 0.995 (default 0.95)",
    )
    p.add_argument(
        "--cores",
        type=_positive_int,
        help="CPU cores of the gateway host, for BEFORE's projections (default: the trace's, "
        "else this machine's)",
    )
    p.add_argument("--service", help="service to query (for a Jaeger URL side)")
    p.add_argument(
        "--lookback", help="how far back to query (for a Jaeger URL side; default 1h)"
    )
    p.add_argument("--limit", type=_positive_int, help="most traces to fetch (for a Jaeger URL side)")
    p.add_argument(
        "--timeout", type=_positive_float, metavar="SECONDS", help="deadline of a Jaeger query"
    )
    p.add_argument(
        "--max-response-mb", type=_positive_float, metavar="MB", help="largest Jaeger answer read"
    )
    p.set_defaults(handler=_run_compare)


def add_demo_command(subparsers: argparse._SubParsersAction[_Parser]) -> None:
    """Register ``tracekit demo``.

    Args:
        subparsers: the object ``ArgumentParser.add_subparsers`` returned.
    """
    p = subparsers.add_parser(
        "demo",
        help="a gateway with the usual problems under load: its diagnosis, the top fix measured",
        description="Start a demo LLM gateway (tokenizer, guardrail and JSON on the event loop, "
        "the guardrail before the model call, a model server without batching) and its "
        "simulated model server on loopback, load it, print the diagnosis, write the HTML "
        "report, then apply the top fix, load it again and show measured against projected.",
    )
    p.add_argument("--out", default="tracekit-demo", metavar="DIR",
                   help="folder for the traces and reports (default ./tracekit-demo)")  # fmt: skip
    p.add_argument("--requests", type=_positive_int, default=120, help="requests per run (default 120)")
    p.add_argument("--concurrency", type=_positive_int, default=8,
                   help="clients sending requests at once (default 8)")  # fmt: skip
    p.add_argument("--otlp", action="store_true",
                   help="also send the traces to OTEL_EXPORTER_OTLP_ENDPOINT (Jaeger, Phoenix)")  # fmt: skip
    p.add_argument("--keep-running", action="store_true",
                   help="then leave the gateway up to explore, until Ctrl-C")  # fmt: skip
    p.add_argument("--cores", type=_positive_int, default=None, metavar="N",
                   help="CPU cores of the gateway host for the replay, as in analyze "
                        "(default: the trace's, which the demo gateway records)")  # fmt: skip
    p.set_defaults(handler=_run_demo)


#: Subcommand registrars, in help order.
COMMANDS: list[Callable[[argparse._SubParsersAction[_Parser]], None]] = [
    add_analyze_command,
    add_compare_command,
    add_demo_command,
]


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
                args, extra = build_parser().parse_known_args(argv)
            except SystemExit as exc:  # --help, --version: argparse printed and exits 0
                return exc.code if isinstance(exc.code, int) else EXIT_OK
            if getattr(args, "handler", None) is None:
                raise _UsageError("missing command (see 'tracekit --help')")
            if extra:  # the command's own help lists what it takes
                raise _UsageError(f"unrecognized arguments: {' '.join(extra)} "
                                  f"(see 'tracekit {args.command} --help')")  # fmt: skip
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
    line = escape_controls(" ".join(message.split()))  # a message can quote trace text
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

    given = [x for x in (args.source, args.jaeger, args.phoenix) if x is not None]
    if len(given) != 1:
        raise _UsageError(
            "give a trace file, --jaeger URL or --phoenix URL (exactly one) "
            "(see 'tracekit analyze --help')"
        )
    if args.jaeger is not None and not _is_http_url(args.jaeger):
        raise _UsageError(
            f"--jaeger: {args.jaeger!r} is not an http(s) URL (e.g. http://localhost:16686)"
        )
    if args.jaeger is not None and not args.service:
        raise _UsageError("--jaeger needs --service NAME (see 'tracekit analyze --help')")
    if args.phoenix is not None and not _is_http_url(args.phoenix):
        raise _UsageError(
            f"--phoenix: {args.phoenix!r} is not an http(s) URL (e.g. http://localhost:6006)"
        )
    if args.phoenix is not None and (args.service is not None or args.limit is not None):
        raise _UsageError("--service and --limit apply to --jaeger, not --phoenix")
    if args.project is not None and args.phoenix is None:
        raise _UsageError("--project applies to --phoenix (see 'tracekit analyze --help')")
    source = given[0]
    if args.source is not None and args.lookback is not None:
        raise _UsageError("--lookback: the query options apply only to a Jaeger query URL or "
                          "a Phoenix URL, not a trace file")  # fmt: skip
    project = None
    if args.phoenix is not None:
        from tracekit.analysis.readers.phoenix_api import DEFAULT_PROJECT

        project = args.project or DEFAULT_PROJECT
    if args.output is not None:
        _check_output(args.output, args.source)  # before the analysis, not after
    report = analyze(
        source,
        route=args.route,
        slo=args.slo,
        service=args.service,
        lookback=args.lookback or "1h",
        limit=args.limit,
        timeout=args.timeout,
        max_response_mb=args.max_response_mb,
        project=project,
        cores=args.cores,
    )
    for warning in report.warnings:
        print(f"tracekit: warning: {escape_controls(' '.join(warning.split()))}", file=sys.stderr)
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
        write_output(args.output, text)
    if args.fail_on is not None and _reaches(report.worst_severity(), args.fail_on):
        return EXIT_FINDINGS
    return EXIT_OK


def _run_compare(args: argparse.Namespace) -> int:
    from tracekit.analysis.compare import compare

    if args.lookback is not None and not any(_is_http_url(s) for s in (args.before, args.after)):
        raise _UsageError("--lookback applies to a Jaeger query URL side, and neither run is one")
    for source in (args.before, args.after):
        if args.output is not None:
            _check_output(args.output, source)  # before reading, not after
    comparison = compare(
        args.before,
        args.after,
        route=args.route,
        finding=args.finding,
        confidence=args.confidence,
        service=args.service,
        lookback=args.lookback or "1h",
        limit=args.limit,
        timeout=args.timeout,
        max_response_mb=args.max_response_mb,
        cores=args.cores,
    )
    for side in (comparison.before, comparison.after):
        for warning in side.warnings:
            line = escape_controls(" ".join(warning.split()))
            print(f"tracekit: warning: {side.source}: {line}", file=sys.stderr)
    if args.format == "json":
        text = comparison.to_json() + "\n"
    else:
        text = comparison.to_text(
            width=None if args.output is None else 100, color=False if args.output else None
        )
    if args.output is None:
        _write_stdout(text)
    else:
        write_output(args.output, text)
    return EXIT_OK


def _run_demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tracekit.demo.runner import Options, run

    if args.concurrency > args.requests:
        raise _UsageError(f"--concurrency {args.concurrency}: more clients than --requests "
                          f"{args.requests} (each client sends one request at a time)")  # fmt: skip
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        # A folder that exists but takes no files (no permission, sysfs) fails here, not as
        # an internal error once the servers start.
        tempfile.TemporaryFile(dir=out).close()
    except OSError as exc:  # an existing file, no permission, a read-only place
        raise _UsageError(f"--out {args.out}: cannot use it as the demo's folder ({exc.strerror})") from None
    return run(Options(out, args.requests, args.concurrency, args.otlp, args.keep_running,
                       args.cores))  # fmt: skip


def _is_http_url(text: str) -> bool:
    try:
        parts = urlsplit(text)
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return False
    return parts.scheme.lower() in ("http", "https") and bool(parts.netloc)


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
    return worst is not None and severity_at_least(worst, threshold)


def write_output(path: str, text: str) -> None:
    """Write the report to ``path`` (``-o``) the way that kind of path is meant to be written.

    - a new name or a regular file: atomically (:func:`write_atomic`): a reader sees the old
      file or the whole new one, and an existing file keeps its permissions;
    - a symbolic link: followed; its target is written as above and the link stays a link;
    - the very file this process's stdout or stderr is (``/dev/stdout``, ``/dev/fd/2``,
      ``/proc/self/fd/1``): written to that descriptor, so a shell's ``>>`` still appends;
    - a FIFO or a character device (``/dev/null``, a terminal): written into, never
      replaced;
    - a directory, a block device, a socket, an empty path: refused.

    Args:
        path: the ``-o`` argument.
        text: the report.

    Raises:
        ConfigurationError: refused, or the write failed (one line naming ``path``).
    """
    kind, _ = _output_kind(path)
    try:
        if kind in ("stdout", "stderr"):
            _write_fd(1 if kind == "stdout" else 2, text)
        elif kind == "special":
            fd = os.open(path, os.O_WRONLY | getattr(os, "O_NOCTTY", 0))  # never creates
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
        else:
            write_atomic(path, text)
    except BrokenPipeError:
        if kind == "stdout":
            raise  # the reader of stdout went away: exit 141, as without -o
        raise ConfigurationError(f"cannot write {path}: its reader went away") from None
    except OSError as exc:
        raise ConfigurationError(f"cannot write {path}: {exc.strerror or exc}") from exc


def _check_output(path: str, source: str | None) -> None:
    # -o mistakes found before the analysis rather than after it.
    kind, st = _output_kind(path)
    if kind != "file":
        return
    if st is None:
        folder = os.path.dirname(os.path.realpath(path))
        if not os.path.isdir(folder):
            raise ConfigurationError(f"cannot write {path}: no such directory {folder}")
    elif source:
        with contextlib.suppress(OSError):
            if os.path.samefile(source, path):
                raise ConfigurationError(f"-o {path} is the trace file being read")


def _output_kind(path: str) -> tuple[str, os.stat_result | None]:
    # "file" (st None: it does not exist yet), "stdout", "stderr" or "special"; else raise.
    if not path:
        raise ConfigurationError("-o: empty file path")
    try:
        st = os.stat(path)  # follows symbolic links
    except FileNotFoundError:
        return "file", None  # a new file (or a dangling link: its target is created)
    except OSError as exc:  # a link loop, a path through a file, no permission
        raise ConfigurationError(f"cannot write {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:  # a NUL in the path (Python callers; argv cannot hold one)
        raise ConfigurationError(f"cannot write {path!r}: {exc}") from exc
    if stat.S_ISDIR(st.st_mode):
        raise ConfigurationError(f"cannot write {path}: is a directory (-o takes a file path)")
    for fd, name in ((1, "stdout"), (2, "stderr")):
        with contextlib.suppress(OSError):
            std = os.fstat(fd)
            if (std.st_dev, std.st_ino) == (st.st_dev, st.st_ino):
                return name, st
    if stat.S_ISREG(st.st_mode):
        return "file", st
    if stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode):
        return "special", st
    raise ConfigurationError(f"cannot write {path}: not a regular file, FIFO or character device")


def _write_fd(fd: int, text: str) -> None:
    # Straight to the descriptor (its offset and O_APPEND are the shell's), after Python's
    # own buffered stdout and stderr.
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    data = memoryview(text.encode("utf-8"))
    while data:
        data = data[os.write(fd, data) :]


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one.

    A symbolic link is followed: its target is replaced, the link stays. An existing file
    keeps its permission bits (and, where this process may set it, its owner); one this
    process may not write is refused, as a shell's ``>`` would refuse it.

    Args:
        path: the destination: a new name or a regular file.
        text: the content (UTF-8).

    Raises:
        ConfigurationError: the file cannot be written (missing directory, permissions, not
            a regular file).
    """
    target = os.path.realpath(path)
    try:
        old: os.stat_result | None = os.stat(target)
    except OSError:
        old = None
    if old is not None and not stat.S_ISREG(old.st_mode):
        raise ConfigurationError(f"cannot write {path}: not a regular file")
    if old is not None and not os.access(target, os.W_OK):
        raise ConfigurationError(f"cannot write {path}: permission denied")
    directory = os.path.dirname(target)
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tracekit-", suffix=".tmp")
    except OSError as exc:
        raise ConfigurationError(f"cannot write {path}: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        if old is None:
            # mkstemp makes the file 0600; give it the mode a plain open() would have.
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        else:
            mode = stat.S_IMODE(old.st_mode)
            if hasattr(os, "chown"):  # before chmod: chown clears set-id bits
                with contextlib.suppress(OSError):
                    os.chown(tmp, old.st_uid, old.st_gid)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise ConfigurationError(f"cannot write {path}: {exc.strerror or exc}") from exc
        raise
