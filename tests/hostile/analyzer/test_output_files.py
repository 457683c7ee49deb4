"""``-o`` writes what each kind of path expects, and never replaces a special file.

A regular file or a new name is replaced atomically (a temporary file beside it, then a
rename), keeping an existing file's permissions. A symbolic link is followed: its target is
written, the link stays. A FIFO or a character device (``/dev/null``, a terminal) is written
into, never renamed over: these tests run as root in CI, where a rename onto ``/dev/null``
would succeed and break the machine. ``/dev/stdout`` is the very descriptor, so a shell's
``>>`` still appends. A directory, a socket, an empty path, a missing folder and the trace
file itself are refused with one line on stderr, exit 2, before the analysis runs.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT, gen_traces
from tracekit.cli import main


def run_main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("out") / "gateway.jsonl"
    gen_traces().write_jsonl(path, 300, rate=40.0, seed=7)
    return path


@pytest.fixture
def no_analysis(monkeypatch: pytest.MonkeyPatch) -> None:
    """The analysis fails the test if it runs: a refused -o must be found before it."""
    import tracekit.analysis.api as api

    def analysed(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the analysis ran before -o was checked")

    monkeypatch.setattr(api, "analyze", analysed)


def leftovers(*folders: Path) -> list[str]:
    return [
        p.name for folder in folders for p in folder.iterdir() if p.name.startswith(".tracekit-")
    ]


# --- regular files and links: atomic replace ----------------------------------------------
def test_a_regular_file_is_replaced_atomically_and_keeps_its_mode(
    trace: Path, tmp_path: Path
) -> None:
    target = tmp_path / "report.txt"
    target.write_text("old")
    target.chmod(0o640)
    inode = target.stat().st_ino
    code, out, err = run_main("analyze", str(trace), "-o", str(target))
    assert (code, out, err) == (0, "", "")
    assert target.read_text().startswith("tracekit report")
    assert target.stat().st_ino != inode  # renamed over, not rewritten in place
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert leftovers(tmp_path) == []


def test_a_new_file_gets_the_mode_of_a_plain_open(trace: Path, tmp_path: Path) -> None:
    umask = os.umask(0o027)
    try:
        code, _, err = run_main(
            "analyze", str(trace), "--format", "json", "-o", str(tmp_path / "n")
        )
    finally:
        os.umask(umask)
    assert code == 0, err
    assert stat.S_IMODE((tmp_path / "n").stat().st_mode) == 0o640
    assert json.loads((tmp_path / "n").read_text())["schema"] == "tracekit.report/1"


def test_a_symlink_is_followed_and_stays_a_link(trace: Path, tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    real = folder / "2026-12-03.txt"
    real.write_text("old")
    link = tmp_path / "latest.txt"
    link.symlink_to(real)
    code, _, err = run_main("analyze", str(trace), "-o", str(link))
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text().startswith("tracekit report")
    assert leftovers(tmp_path, folder) == []  # the temporary file was made beside the target


def test_a_dangling_symlink_creates_its_target(trace: Path, tmp_path: Path) -> None:
    link = tmp_path / "latest.txt"
    link.symlink_to("new.txt")
    code, _, err = run_main("analyze", str(trace), "-o", str(link))
    assert code == 0, err
    assert link.is_symlink() and (tmp_path / "new.txt").read_text().startswith("tracekit report")


def test_a_symlink_loop_is_one_error_line(trace: Path, tmp_path: Path, no_analysis: None) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    code, out, err = run_main("analyze", str(trace), "-o", str(tmp_path / "a"))
    assert (code, out) == (2, "")
    assert (
        err
        == f"tracekit: error: cannot write {tmp_path / 'a'}: Too many levels of symbolic links\n"
    )


# --- special files: written into, never replaced --------------------------------------------
def test_dev_null_stays_a_character_device(trace: Path) -> None:
    before = os.stat("/dev/null")
    assert stat.S_ISCHR(before.st_mode)
    code, out, err = run_main("analyze", str(trace), "--format", "html", "-o", "/dev/null")
    after = os.stat("/dev/null")
    assert (code, out, err) == (0, "", "")
    assert stat.S_ISCHR(after.st_mode), "/dev/null was replaced by a regular file"
    assert (after.st_ino, after.st_rdev, after.st_mode) == (
        before.st_ino,
        before.st_rdev,
        before.st_mode,
    )
    assert leftovers(Path("/dev")) == []


def test_a_symlink_to_dev_null_writes_into_the_device(trace: Path, tmp_path: Path) -> None:
    link = tmp_path / "sink"
    link.symlink_to("/dev/null")
    code, _, err = run_main("analyze", str(trace), "-o", str(link))
    assert code == 0, err
    assert link.is_symlink() and stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert leftovers(Path("/dev"), tmp_path) == []


def test_a_fifo_is_written_into(trace: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []

    def read() -> None:
        with open(fifo, "rb") as f:
            received.append(f.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        code, out, err = run_main("analyze", str(trace), "--format", "json", "-o", str(fifo))
    finally:
        if reader.is_alive():  # the CLI never opened the FIFO: release the reader
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
    assert (code, out, err) == (0, "", "")
    assert json.loads(received[0])["schema"] == "tracekit.report/1"
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert leftovers(tmp_path) == []


def test_dev_stdout_is_the_shells_descriptor_so_append_appends(trace: Path, tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_text("an earlier line\n")
    inode = log.stat().st_ino
    with log.open("ab") as out:
        done = subprocess.run(
            [sys.executable, "-m", "tracekit", "analyze", str(trace), "--format", "json",
             "-o", "/dev/stdout"],
            stdout=out, stderr=subprocess.PIPE, text=True, timeout=60, cwd=ROOT,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    first, rest = log.read_text().split("\n", 1)
    assert first == "an earlier line" and json.loads(rest)["schema"] == "tracekit.report/1"
    assert log.stat().st_ino == inode and leftovers(tmp_path) == []


# --- refused: one line, exit 2, before the analysis ------------------------------------------
def assert_refused(argv: list[str], message: str) -> None:
    code, out, err = run_main(*argv)
    assert (code, out) == (2, "")
    assert err == f"tracekit: error: {message}\n"


def test_a_directory_is_one_clear_error_line(
    trace: Path, tmp_path: Path, no_analysis: None
) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    message = f"cannot write {folder}: is a directory (-o takes a file path)"
    assert_refused(["analyze", str(trace), "-o", str(folder)], message)
    assert_refused(["analyze", str(trace), "-o", f"{folder}/"], message.replace(": is", "/: is"))
    link = tmp_path / "to-reports"
    link.symlink_to(folder)
    assert_refused(
        ["analyze", str(trace), "-o", str(link)], message.replace(str(folder), str(link))
    )
    assert folder.is_dir() and list(folder.iterdir()) == [] and leftovers(tmp_path) == []


def test_an_empty_path_is_refused(trace: Path, no_analysis: None) -> None:
    assert_refused(["analyze", str(trace), "-o", ""], "-o: empty file path")


def test_a_missing_folder_is_refused(trace: Path, tmp_path: Path, no_analysis: None) -> None:
    target = tmp_path / "no" / "report.txt"
    assert_refused(
        ["analyze", str(trace), "-o", str(target)],
        f"cannot write {target}: no such directory {target.parent}",
    )


def test_the_trace_file_being_read_is_refused(
    trace: Path, tmp_path: Path, no_analysis: None
) -> None:
    copy = tmp_path / "traces.jsonl"
    copy.write_bytes(trace.read_bytes())
    link = tmp_path / "same.jsonl"
    link.symlink_to(copy)
    assert_refused(
        ["analyze", str(copy), "-o", str(link)], f"-o {link} is the trace file being read"
    )
    assert copy.read_bytes() == trace.read_bytes()


def test_a_socket_is_refused(trace: Path, no_analysis: None) -> None:
    with tempfile.TemporaryDirectory() as folder:  # short: a socket path has ~100 bytes
        path = os.path.join(folder, "s")
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(path)
            message = f"cannot write {path}: not a regular file, FIFO or character device"
            assert_refused(["analyze", str(trace), "-o", path], message)
            assert stat.S_ISSOCK(os.stat(path).st_mode)


def test_a_read_only_file_is_refused_like_a_shell_would(
    trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "kept.txt"
    target.write_text("keep me")
    target.chmod(0o444)
    if os.geteuid() == 0:  # root may write any file: make this one unwritable to the check
        access = os.access

        def no_write(path: Any, mode: int, **kwargs: Any) -> bool:
            if os.fspath(path) == os.path.realpath(target) and mode == os.W_OK:
                return False
            return access(path, mode, **kwargs)

        monkeypatch.setattr(os, "access", no_write)
    message = f"cannot write {target}: permission denied"
    assert_refused(["analyze", str(trace), "-o", str(target)], message)
    assert target.read_text() == "keep me" and leftovers(tmp_path) == []
