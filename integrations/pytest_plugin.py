"""tracekit's pytest plugin: record a test's requests, and hold them to performance budgets.

Registered through the ``pytest11`` entry point (``tracekit = tracekit.integrations.pytest_plugin``),
so it loads in every pytest run where tracekit is installed; it is inert unless used. Importing
it imports nothing of tracekit's beyond the package, reads no environment and installs no
tracer provider; nothing happens to a test that neither requests the ``tracekit_record``
fixture nor carries the ``tracekit_budget`` marker, and the report header gains a line only
when ``tracekit_budget_*`` ini options are set.

- fixture ``tracekit_record``: the test's spans, in memory (``tracekit.record()``);
- marker ``@pytest.mark.tracekit_budget(stage_p95_ms={"tokenize": 5}, max_block_ms=20, ...)``:
  checked when the test body has passed, over the requests recorded during the test (the
  marker brings the fixture); a budget not met fails the test with a table (budget,
  measured, which requests). Keys: :data:`tracekit.integrations.pytest_budgets.KEYS`.
- ini options ``tracekit_budget_<key>``: defaults for the marker's keys (``None`` in the
  marker unsets one).

Docs: ``docs/pytest.md``. The budget logic lives in :mod:`tracekit.integrations.pytest_budgets`.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tracekit.recording import Recording

MARKER = "tracekit_budget"
FIXTURE = "tracekit_record"
_DEFAULTS = pytest.StashKey[dict[str, Any]]()
_BUDGETS = pytest.StashKey[dict[str, Any]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    from tracekit.integrations.pytest_budgets import KEYS

    for key, meaning in KEYS.items():
        parser.addini(f"tracekit_budget_{key}", f"tracekit_budget default: {meaning}", default=None)


def pytest_configure(config: pytest.Config) -> None:
    from tracekit.integrations.pytest_budgets import valid_keys

    config.addinivalue_line(
        "markers",
        f"{MARKER}(**budgets): fail the test when the requests it recorded exceed these budgets "
        f"({valid_keys()}; docs/pytest.md)",
    )
    config.stash[_DEFAULTS] = _ini_defaults(config)


def _ini_defaults(config: pytest.Config) -> dict[str, Any]:
    from tracekit.errors import ConfigurationError
    from tracekit.integrations.pytest_budgets import KEYS, parse_ini

    defaults: dict[str, Any] = {}
    for key in KEYS:
        text = config.getini(f"tracekit_budget_{key}")
        if text:
            try:
                defaults[key] = parse_ini(key, text)
            except ConfigurationError as exc:
                raise pytest.UsageError(str(exc)) from None
    return defaults


def pytest_report_header(config: pytest.Config) -> str | None:
    defaults = config.stash.get(_DEFAULTS, {})
    if not defaults:
        return None
    from tracekit.integrations.pytest_budgets import describe

    return f"tracekit budgets (ini defaults of @pytest.mark.{MARKER}): {describe(defaults)}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Budgets are validated here, so a bad key stops the run before any test runs. A marked
    # test gets the recording fixture, set up after its other fixtures (what they send, a
    # warm-up say, is not the test's) and torn down after the check.
    for item in items:
        marker = item.get_closest_marker(MARKER)
        if marker is None:
            continue
        item.stash[_BUDGETS] = _budgets(config, item, marker)
        names = getattr(item, "fixturenames", None)
        if names is not None and FIXTURE not in names:
            names.append(FIXTURE)


def _budgets(config: pytest.Config, item: pytest.Item, marker: pytest.Mark) -> dict[str, Any]:
    from tracekit.errors import ConfigurationError
    from tracekit.integrations.pytest_budgets import parse, valid_keys

    origin = f"{item.nodeid}: @pytest.mark.{MARKER}"
    if marker.args:
        raise pytest.UsageError(f"{origin} takes keyword arguments only ({valid_keys()})")
    try:
        given = parse(marker.kwargs, origin)
    except ConfigurationError as exc:
        raise pytest.UsageError(str(exc)) from None
    defaults: dict[str, Any] = config.stash.get(_DEFAULTS, {})
    budgets = {key: value for key, value in {**defaults, **given}.items() if value is not None}
    if not budgets:
        raise pytest.UsageError(
            f"{origin} sets no budget, and no tracekit_budget_* ini option does ({valid_keys()})"
        )
    return budgets


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    result = yield  # a failing test body fails as it is: the budget is not checked
    budgets = item.stash.get(_BUDGETS, None)
    if budgets:
        recording = getattr(item, "funcargs", {}).get(FIXTURE)
        if recording is None:  # an item that takes no fixtures (a unittest.TestCase method)
            message = f"needs a pytest test function (it adds the {FIXTURE} fixture)"
            pytest.fail(f"@pytest.mark.{MARKER}: {item.nodeid} recorded nothing: the marker {message}",
                        pytrace=False)  # fmt: skip
        from tracekit.integrations.pytest_budgets import check

        outcome = check(recording, budgets)
        if outcome.breaches:
            pytest.fail(outcome.table(), pytrace=False)
    return result


@pytest.fixture
def tracekit_record() -> Iterator[Recording]:
    """The spans tracekit records during the test, in memory (``tracekit.record()``).

    Every request is recorded (sampling is bypassed) by every ``TracekitMiddleware``; with
    nothing configured the spans go only here. ``rec.spans``, ``rec.report()``,
    ``rec.settle()``: see :class:`tracekit.recording.Recording`.
    """
    import tracekit

    with tracekit.record() as recording:
        yield recording
