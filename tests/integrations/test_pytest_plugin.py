"""The pytest plugin, run by pytest itself (``pytester``, in a subprocess: a fresh interpreter,
so that "nothing changed" means nothing).

Each inner run loads the plugin by module (``-p no:tracekit -p MODULE``: the worktree's module
whether or not the ``pytest11`` entry point is installed). Budgets are chosen so that pass and
fail are unambiguous on a busy machine: a stage that sleeps 50 ms against a 5 ms budget, a
stage that does nothing against a 40 ms one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PLUGIN = "tracekit.integrations.pytest_plugin"
LOAD = ("-p", "no:tracekit", "-p", PLUGIN)

pytest_plugins = ["pytester"]

# A gateway in the inner test files: a tokenize stage that is fast, or sleeps 50 ms on the
# event loop (the stage's wall time and its hold of the loop are both >= 50 ms).
APP = """
import time

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

import tracekit


@tracekit.stage("tokenize")
def tokenize(slow):
    if slow:
        time.sleep(0.05)


def serve(slow, requests=10):
    async def chat(request):
        tokenize(slow)
        return PlainTextResponse("ok")

    app = tracekit.TracekitMiddleware(Starlette(routes=[Route("/chat", chat)]))
    with TestClient(app) as client:
        for _ in range(requests):
            assert client.get("/chat").status_code == 200
"""


def run(pytester: pytest.Pytester, tests: str, *args: str, subprocess: bool = True) -> pytest.RunResult:
    """Run ``tests`` (with APP) under the plugin; in-process only where no test body runs."""
    pytester.makepyfile(test_gateway=APP + textwrap.dedent(tests))
    if subprocess:
        return pytester.runpytest_subprocess(*LOAD, *args)
    return pytester.runpytest_inprocess(*LOAD, *args)


def test_a_budget_the_requests_meet_passes(pytester: pytest.Pytester) -> None:
    result = run(pytester, """
        @pytest.mark.tracekit_budget(stage_p95_ms={"tokenize": 40}, max_block_ms=100)
        def test_fast():
            serve(slow=False)
    """)  # fmt: skip
    result.assert_outcomes(passed=1)


def test_a_budget_exceeded_fails_with_its_table(pytester: pytest.Pytester) -> None:
    result = run(pytester, """
        @pytest.fixture
        def warm_up():
            with tracekit.record():  # (unrecorded, the middleware would configure an exporter)
                serve(slow=True, requests=5)  # before the test: not its requests

        @pytest.mark.tracekit_budget(stage_p95_ms={"tokenize": 5}, max_block_ms=20,
                                     loop_wait_p95_ms=1000, findings="none")
        def test_slow(warm_up):
            serve(slow=True)
    """)  # fmt: skip
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "tracekit budget exceeded (10 requests recorded):",
        "  budget * measured * requests",
        "  stage_p95_ms[[]tokenize[]] <= 5 ms  p95 * ms * 10 of 10 over: GET /chat x10 (worst * ms)",
        "  max_block_ms <= 20 ms * max * ms * 10 of 10 over: GET /chat x10 (worst * ms)",
        "  findings: none * worst * blocking-call-on-loop (*) on GET /chat stage tokenize*",
    ])  # fmt: skip
    out = result.stdout.str()
    # The table's two rows (with CI set, pytest's short summary repeats the whole message)
    measured = re.findall(r"(?:p95|max) (\d+(?:\.\d)?) ms", out)[:2]
    assert len(measured) == 2 and all(float(ms) >= 50 for ms in measured), measured  # the 50 ms sleep
    assert "loop_wait_p95_ms" not in out  # a budget met is not listed
    assert "Traceback" not in out and "assert " not in out  # the table, not a bare assert


def test_a_failing_test_body_fails_as_it_is(pytester: pytest.Pytester) -> None:
    result = run(pytester, """
        @pytest.mark.tracekit_budget(stage_p95_ms={"tokenize": 5})
        def test_broken():
            serve(slow=True)
            assert 1 == 2, "the test's own failure"
    """)  # fmt: skip
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*the test's own failure*"])
    assert "tracekit budget exceeded" not in result.stdout.str()


@pytest.mark.parametrize(("marker", "message"), [
    ("p95_ms=5", "unknown budget 'p95_ms'; valid: stage_p95_ms, max_block_ms, overhead_ratio, "
                 "loop_wait_p95_ms, ttft_p95_ms, findings"),
    ("max_block_ms='fast'", "max_block_ms='fast': expected a number > 0"),
    ("overhead_ratio=1.5", "overhead_ratio=1.5: a ratio is at most 1"),
    ("findings='severe'", "findings='severe': expected one of 'none', 'low', 'medium', 'high'"),
    ("stage_p95_ms=5", "stage_p95_ms=5: expected a dict of stage name to ms"),
    ("20", "takes keyword arguments only"),
    ("", "sets no budget, and no tracekit_budget_* ini option does"),
])  # fmt: skip
def test_a_bad_budget_is_a_usage_error(pytester: pytest.Pytester, marker: str, message: str) -> None:
    result = run(pytester, f"""
        @pytest.mark.tracekit_budget({marker})
        def test_it():
            serve(slow=False)
    """, subprocess=False)  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: test_gateway.py::test_it: @pytest.mark.tracekit_budget*{message}*"])
    assert "Traceback" not in result.stderr.str()


def test_a_project_that_never_uses_the_plugin(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="""
        import sys

        def test_nothing_of_tracekit(request):
            from opentelemetry import trace
            from tracekit._core import current
            from tracekit._export import tracing

            assert request.config.pluginmanager.has_plugin("tracekit.integrations.pytest_plugin")
            assert trace._TRACER_PROVIDER is None  # no tracer provider installed
            assert current.active_runtime is None and tracing.recorders == []
            assert "opentelemetry.sdk" not in sys.modules  # nothing of the SDK imported
    """)  # fmt: skip
    result = pytester.runpytest_subprocess(*LOAD, "-v")
    result.assert_outcomes(passed=1)
    assert not [line for line in result.stdout.lines if line.startswith("tracekit")]  # no header line


def test_importing_the_plugin_reads_no_environment_and_imports_nothing_more() -> None:
    probe = textwrap.dedent(f"""
        import os, sys
        import pytest, tracekit
        read = []

        class Spy(dict):
            def __getitem__(self, key):
                read.append(key)
                return super().__getitem__(key)
            def get(self, key, default=None):
                read.append(key)
                return super().get(key, default)

        os.environ = Spy(os.environ)
        before = set(sys.modules)
        import {PLUGIN}
        print(sorted(set(sys.modules) - before), read)
    """)  # fmt: skip
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"[{'tracekit.integrations'!r}, {PLUGIN!r}] []"


def test_ini_options_are_the_markers_defaults(pytester: pytest.Pytester) -> None:
    pytester.makeini("""
        [pytest]
        tracekit_budget_stage_p95_ms = tokenize=5
        tracekit_budget_max_block_ms = 20
    """)  # fmt: skip
    result = run(pytester, """
        @pytest.mark.tracekit_budget
        def test_defaults():
            serve(slow=True)

        @pytest.mark.tracekit_budget(stage_p95_ms={"tokenize": 5000}, max_block_ms=None)
        def test_overridden():
            serve(slow=True)

        def test_unmarked():
            with tracekit.record():
                serve(slow=True)  # ini budgets apply to marked tests only
    """)  # fmt: skip
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "tracekit budgets (ini defaults of @pytest.mark.tracekit_budget): stage_p95_ms=tokenize:5, "
        "max_block_ms=20",
        "*_ test_defaults _*",
        "tracekit budget exceeded (10 requests recorded):",
        "  stage_p95_ms[[]tokenize[]] <= 5 ms *",
        "  max_block_ms <= 20 ms *",
    ])  # fmt: skip


def test_a_bad_ini_value_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeini("""
        [pytest]
        tracekit_budget_stage_p95_ms = tokenize
    """)  # fmt: skip
    result = run(pytester, "def test_x():\n    pass\n", subprocess=False)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "ERROR: ini option tracekit_budget_stage_p95_ms: expected stage=ms pairs like "
        "'tokenize=5 model=300', not 'tokenize'",
    ])  # fmt: skip


def test_the_fixture_records_the_tests_spans(pytester: pytest.Pytester) -> None:
    result = run(pytester, """
        def test_recorded(tracekit_record):
            serve(slow=False, requests=3)
            names = sorted(s.name for s in tracekit_record.spans if s.name != "tracekit.loop")
            assert names == ["GET /chat"] * 3 + ["tokenize"] * 3, names

        def test_nothing_left_after(tracekit_record):
            assert tracekit_record.spans == []
    """)  # fmt: skip
    result.assert_outcomes(passed=2)


def test_the_entry_point_loads_the_plugin_by_its_name(pytester: pytest.Pytester,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    entry_points = project["project"]["entry-points"]["pytest11"]
    assert entry_points == {"tracekit": PLUGIN}
    assert "tracekit.integrations" in project["tool"]["setuptools"]["packages"]
    # What installing tracekit writes, on the path of the inner runs: pytest loads the plugin
    # from it with no -p, under the name -p no:NAME turns off.
    site = pytester.path / "site"
    dist = site / "tracekit_probe-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tracekit-probe\nVersion: 0\n")
    lines = "".join(f"{name} = {module}\n" for name, module in entry_points.items())
    (dist / "entry_points.txt").write_text(f"[pytest11]\n{lines}")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    pytester.makeini("[pytest]\ntracekit_budget_max_block_ms = 20\n")
    pytester.makepyfile("def test_x():\n    pass\n")
    header = "tracekit budgets (ini defaults of @pytest.mark.tracekit_budget): max_block_ms=20"
    result = pytester.runpytest_subprocess()
    result.stdout.fnmatch_lines([header])
    result = pytester.runpytest_subprocess("-p", "no:tracekit")
    assert header not in result.stdout.str()
    result.stdout.fnmatch_lines(["*Unknown config option: tracekit_budget_max_block_ms*"])  # not loaded
