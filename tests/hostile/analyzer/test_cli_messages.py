"""Each careless command line gets the message about its own mistake: one line, exit 2.

``tracekit analyze ""`` once said ``: is a directory, not a trace file`` (the empty path is
the current folder); ``--jaeger notaurl`` once complained that ``service, lookback and limit
apply only to a Jaeger query URL``, blaming the options that were right.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import subprocess
import sys

import pytest

from tests.helpers import ROOT
from tracekit.cli import main

EXAMPLE = "(e.g. http://localhost:16686)"


def run_main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def assert_message(argv: list[str], message: str) -> None:
    code, out, err = run_main(*argv)
    assert (code, out) == (2, ""), err
    assert err == f"tracekit: error: {message}\n"


def test_an_empty_trace_path_says_so() -> None:
    assert_message(["analyze", ""], "empty trace file path")
    assert_message(["analyze", "", "--format", "json", "-o", "/dev/null"], "empty trace file path")


@pytest.mark.parametrize(
    "url",
    [
        "notaurl",
        "localhost:16686",
        "ftp://jaeger:16686",
        "http://",
        "https:///api",
        "http://[::1",
        "",
    ],
)
@pytest.mark.parametrize(
    "extra", [["--service", "gw"], [], ["--service", "gw", "--lookback", "2h"]]
)
def test_a_jaeger_value_that_is_no_url_is_blamed_itself(url: str, extra: list[str]) -> None:
    message = f"--jaeger: {url!r} is not an http(s) URL {EXAMPLE}"
    assert_message(["analyze", "--jaeger", url, *extra], message)


def test_a_jaeger_url_with_control_characters_is_quoted_inert() -> None:
    code, _, err = run_main("analyze", "--jaeger", "\x1b[2Jx", "--service", "gw")
    assert code == 2
    assert err == f"tracekit: error: --jaeger: '\\x1b[2Jx' is not an http(s) URL {EXAMPLE}\n"


def test_a_real_url_passes_the_check_in_any_case() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for url in (f"http://127.0.0.1:{port}", f"HTTPS://127.0.0.1:{port}/jaeger"):
        code, _, err = run_main("analyze", "--jaeger", url, "--service", "gw")
        assert code == 2 and err.count("\n") == 1, err
        assert "is not an http(s) URL" not in err and "apply only" not in err, err


def test_the_messages_come_from_the_installed_command_without_a_traceback() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRACEKIT_DEBUG"}
    cases = {
        ("analyze", ""): "tracekit: error: empty trace file path\n",
        ("analyze", "--jaeger", "notaurl", "--service", "gw"): (
            f"tracekit: error: --jaeger: 'notaurl' is not an http(s) URL {EXAMPLE}\n"
        ),
    }
    for argv, expected in cases.items():
        done = subprocess.run(
            [sys.executable, "-m", "tracekit", *argv],
            capture_output=True, text=True, timeout=60, cwd=ROOT, env=env,
        )  # fmt: skip
        assert (done.returncode, done.stdout, done.stderr) == (2, "", expected)


def test_the_library_says_the_same_and_refuses_a_nul() -> None:
    import tracekit
    from tracekit.errors import SourceNotFoundError

    with pytest.raises(SourceNotFoundError, match=r"^empty trace file path$"):
        tracekit.analyze("")
    with pytest.raises(SourceNotFoundError, match="not a valid path"):
        tracekit.analyze("a\x00b")


def test_an_extra_argument_points_to_its_commands_help() -> None:
    assert_message(["compare", "a.jsonl", "b.jsonl", "c.jsonl"],
                   "unrecognized arguments: c.jsonl (see 'tracekit compare --help')")  # fmt: skip
    assert_message(["analyze", "a.jsonl", "--frmat", "json"],
                   "unrecognized arguments: --frmat json (see 'tracekit analyze --help')")  # fmt: skip


def test_a_query_option_given_with_a_file_is_named_as_typed() -> None:
    code, _, err = run_main("analyze", str(ROOT / "README.md"), "--lookback", "2h")
    assert code == 2 and "--lookback" in err and "apply only to a Jaeger query URL" in err
