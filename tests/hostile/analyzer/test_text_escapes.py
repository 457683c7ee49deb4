"""Trace text cannot drive the terminal: every text field of the text report is escaped.

A span name, a route, a service name, ``tracekit.blocked_at``, a fix's title or code, or any
string of a report loaded from JSON may hold ESC sequences (clear the screen, set the window
title, hide text), C1 controls (U+009B is a one-character CSI), bidi overrides ("Trojan
Source") or carriage returns that overwrite a line. The text renderer shows each of them as
a visible escape; the only control characters it emits are its own newlines and, when
colour is on, its own SGR codes. The CLI's stderr lines (errors, warnings) do the same.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import gen_traces
from tests.render.test_text import report_dict
from tracekit.cli import main
from tracekit.render.text import COLOR, escape_controls, render_text

#: Every kind of character a terminal acts on, with a tail so a cut still shows an escape.
PAYLOAD = (
    "\x1b[2J"  # ESC [ 2 J: clear the screen
    "\x1b]0;pwned\x07"  # OSC: set the window title, BEL-terminated
    "\x9b31m"  # C1 CSI (U+009B): the 8-bit form of ESC [
    "\x90q\x9c"  # C1 DCS ... ST
    "\x85"  # C1 NEL
    "\x00\x08\x0b\x0c\r\x7f"  # NUL, backspace, VT, FF, carriage return, DEL
    "\u202e\u2066\u200f\u061c"  # bidi: RLO, LRI, RLM, ALM
    "\u2028\u2029"  # line and paragraph separators
    "\n\t"  # a newline and a tab in a name
    "\ud800"  # a lone surrogate
    "end"
)
#: In a trace file: JSON parsers refuse a lone surrogate, so the payload less that.
TRACE_PAYLOAD = PAYLOAD.replace("\ud800", "")
#: What must never reach the output unescaped (the renderer's own "\n" is allowed).
CONTROL = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]"
)


def assert_inert(text: str, *, color: bool = False) -> None:
    """No control character survives, except newlines and (``color``) the palette's codes."""
    if color:
        for code in set(vars(COLOR).values()):
            text = text.replace(code, "")
    found = sorted({f"U+{ord(c):04X}" for c in CONTROL.findall(text)})
    assert found == [], f"control characters reached the output: {found}"


def set_at(d: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        d = d[key]
    d[path[-1]] = value


#: Every text field the renderer shows: (path of the value in the report dict).
FIELDS: dict[str, tuple[Any, ...]] = {
    "source": ("source",),
    "service name": ("services", 0),
    "validation reason": ("validation", "reason"),
    "route": ("routes", 0, "route"),
    "stage name": ("routes", 0, "stages", 0, "stage"),
    "stage kind": ("routes", 0, "stages", 0, "kind"),
    "stage function": ("routes", 0, "stages", 0, "function"),
    "blocked at": ("routes", 0, "stages", 0, "blocked_at"),
    "finding rule": ("findings", 0, "rule"),
    "finding route": ("findings", 0, "route"),
    "finding stage": ("findings", 0, "stage"),
    "finding function": ("findings", 0, "function"),
    "severity": ("findings", 0, "severity"),
    "evidence": ("findings", 0, "evidence"),
    "fix title": ("findings", 0, "fix", "title"),
    "fix code": ("findings", 0, "fix", "code"),
    "projection note": ("findings", 0, "projection_note"),
}
#: Mappings whose keys the renderer shows (a report loaded from JSON can hold any key).
KEYED: dict[str, tuple[Any, ...]] = {
    "SLO key": ("slo",),
    "breakdown key": ("routes", 0, "breakdown_ms"),
    "streaming quantile key": ("routes", 0, "streaming", "ttft_ms"),
}


def hostile_report(field: str) -> dict[str, Any]:
    d = report_dict()
    if field == "validation reason":
        d["validation"]["ok"] = False
    if field == "projection note":
        d["findings"][0]["projection"] = None
    if field in FIELDS:
        set_at(d, FIELDS[field], PAYLOAD)
    else:
        mapping = d
        for key in KEYED[field]:
            mapping = mapping[key]
        mapping[PAYLOAD] = 12.5
    return d


@pytest.mark.parametrize("color", [False, True])
@pytest.mark.parametrize("field", [*FIELDS, *KEYED])
def test_each_text_field_is_shown_escaped(field: str, color: bool) -> None:
    text = render_text(hostile_report(field), width=200, color=color, unicode=True)
    assert_inert(text, color=color)
    # The field was rendered, visibly: its ESC shows as the four characters \x1b.
    assert "\\x1b[2j" in text.lower(), field


def test_every_string_of_a_report_at_once_at_every_width() -> None:
    def poison(value: Any) -> Any:
        if isinstance(value, str):
            return value + PAYLOAD
        if isinstance(value, dict):
            return {k: poison(v) for k, v in value.items()}
        if isinstance(value, list):
            return [poison(v) for v in value]
        return value

    d = poison(report_dict())
    d["validation"]["ok"] = False
    for width in (40, 80, 200):
        for color in (False, True):
            for unicode in (False, True):
                text = render_text(d, width=width, color=color, unicode=unicode)
                assert_inert(text, color=color)
                assert max(len(line) for line in text.splitlines()) <= width or color


def test_the_escapes_are_readable_and_harmless_text_is_untouched() -> None:
    assert escape_controls("a\x1b[31mb") == "a\\x1b[31mb"
    assert escape_controls("\x9b2J\x85\x7f\x00") == "\\u009b2J\\u0085\\x7f\\x00"
    assert escape_controls("left\u202eright\u2066") == "left\\u202eright\\u2066"
    assert escape_controls("a\nb\tc\rd") == "a\\nb\\tc\\rd"
    assert escape_controls("\ud800") == "\\ud800"
    for text in ("POST /v1/chat/completions", "café · 東京 → ≤ 🚀", "C:\\app\\x1b.py", "a\u00a0b"):
        assert escape_controls(text) == text
    # A fix's code keeps its lines and indentation for the renderer to place.
    assert escape_controls("if x:\n\treturn 1\x1b", code=True) == "if x:\n\treturn 1\\x1b"


def test_the_fix_code_keeps_its_lines_but_not_its_controls() -> None:
    d = report_dict()
    d["findings"][0]["fix"]["code"] = "line one\x1b[2J\n\tline two\r\nline three\x9b"
    text = render_text(d, width=100, color=False)
    assert_inert(text)
    assert "      line one\\x1b[2J\n          line two\\r\n      line three\\u009b\n" in text


# --- end to end: a trace file whose names are hostile, through the command line -------------
HOSTILE_KEYS = {
    "service.name", "tracekit.stage", "code.function", "code.namespace", "http.route", "url.path",
}  # fmt: skip


@pytest.fixture(scope="module")
def hostile_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The simulated gateway with TRACE_PAYLOAD in every name, route, function and blocked_at."""
    folder = tmp_path_factory.mktemp("hostile")
    plain = folder / "gateway.jsonl"
    gen_traces().write_jsonl(plain, 600, rate=40.0, seed=3)
    lines = []
    for line in plain.read_text().splitlines():
        doc = json.loads(line)
        for rs in doc["resourceSpans"]:
            for a in rs["resource"]["attributes"]:
                if a["key"] in HOSTILE_KEYS:
                    a["value"]["stringValue"] += TRACE_PAYLOAD
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    span["name"] += TRACE_PAYLOAD
                    attrs = span["attributes"]
                    for a in attrs:
                        if a["key"] in HOSTILE_KEYS:
                            a["value"]["stringValue"] += TRACE_PAYLOAD
                    if any(a["key"] == "tracekit.stage" for a in attrs):
                        blocked = {"stringValue": "app.py:1 in f" + TRACE_PAYLOAD}
                        attrs.append({"key": "tracekit.blocked_at", "value": blocked})
        lines.append(json.dumps(doc))  # JSON carries every control as \\uXXXX
    path = folder / "hostile.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def run_main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_a_hostile_trace_analysed_to_the_terminal_is_inert(hostile_trace: Path) -> None:
    code, out, err = run_main("analyze", str(hostile_trace))
    assert code == 0, err
    assert_inert(out)
    assert_inert(err)
    assert "Findings (" in out  # the fixes' titles and evidence quote the hostile names
    assert "gateway\\x1b[2J\\x1b]0;pwned\\x07\\u009b31m" in out  # the service, visibly


def test_a_hostile_trace_analysed_to_a_file_is_inert(
    hostile_trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")  # a file never gets colour: -o turns it off
    target = tmp_path / "report.txt"
    code, out, err = run_main("analyze", str(hostile_trace), "-o", str(target))
    assert (code, out) == (0, ""), err
    text = target.read_text(encoding="utf-8")
    assert_inert(text)
    assert "\\u202e" in text and "Findings (" in text


def test_error_and_warning_lines_are_escaped_too(
    hostile_trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = TRACE_PAYLOAD.replace("\x00", "")  # argv cannot hold a NUL
    missing = tmp_path / f"no{name}\udcffsuch.json"  # \udcff: the byte 0xff
    code, out, err = run_main("analyze", str(missing))
    assert (code, out) == (2, "")
    assert_inert(err.removesuffix("\n"))
    assert err.count("\n") == 1 and "no\\x1b[2J\\x1b]0;pwned\\x07\\u009b31m" in err
    assert "end\\udcffsuch.json: no such file" in err

    import tracekit.analysis.api as api

    real = api.analyze

    def with_a_hostile_warning(*args: Any, **kwargs: Any) -> Any:
        report = real(*args, **kwargs)
        report.warnings.append(f"a warning quoting {PAYLOAD}")
        return report

    monkeypatch.setattr(api, "analyze", with_a_hostile_warning)
    code, _, err = run_main("analyze", str(hostile_trace), "--format", "json")
    assert code == 0
    assert_inert(err.removesuffix("\n"))
    assert err.startswith("tracekit: warning: a warning quoting \\x1b[2J") and err.count("\n") == 1
