"""What a stage's code is, read from the trace, so that a fix fits it (DESIGN §4).

A fix is code only where it applies to the stage's **shape** and its **CPU**:

- shape (``tracekit.stage.shape``): a sync function can be handed to a worker thread or,
  when a process pool can pickle it by reference (a module-level function: ``code.function``
  is its ``__qualname__``, so ``Class.method`` is a method and ``<locals>`` a closure), to a
  process pool; a coroutine, an async generator or a ``with`` block cannot be, only the
  CPU-bound part inside it, moved out by hand.
- CPU (:func:`cpu_of`): HF ``tokenizers`` (``Tokenizer.encode`` holds the GIL,
  ``encode_batch`` releases it), JSON encoding or decoding (a faster library), a library
  that releases the GIL in its heavy calls (a thread suffices), or Python code (and C
  extensions such as ``re`` that hold the GIL: only another process runs it in parallel).
  The evidence is the stage kind and the library frames the watchdog caught it running
  (``blocked_frames``); without evidence it says so.

Traces older than the shape attribute have none: :class:`StageCode` then reads what it can
from the function's name, and the fixes fall back to words where code would be a guess.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tracekit import semconv
from tracekit.analysis.assembly.blocked_sites import is_import_site
from tracekit.analysis.model import StageRecord
from tracekit.analysis.stats.intervals import function_of

# What the CPU is (cpu_of): the fix each kind of work admits.
TOKENIZERS = "tokenizers"  # HF tokenizers: encode holds the GIL, encode_batch releases it
JSON_ENCODE = "json-encode"  # json.dumps: orjson is measured 20x faster
JSON_DECODE = "json-decode"  # json.loads: orjson.loads
GIL_FREE = "gil-free"  # a library that releases the GIL in its heavy calls: a thread suffices
PYTHON = "python"  # Python code, or a C extension holding the GIL (re): another process
UNKNOWN = "unknown"

# Library frames that say what the CPU is. Only libraries whose GIL behaviour is known:
# numpy and torch release the GIL in their array operations; tokenizers' Python wrappers
# (tokenizers/implementations) call the Rust encode / encode_batch.
_TOKENIZERS_FRAME = "tokenizers/"
_BUILTIN = "(<built-in>)"  # how pyinstrument names a builtin's place
_FRAME_CPU = (
    (_TOKENIZERS_FRAME, TOKENIZERS),
    ("json/encoder.py", JSON_ENCODE),
    ("json/decoder.py", JSON_DECODE),
    ("orjson", JSON_ENCODE),
    ("numpy/", GIL_FREE),
    ("torch/", GIL_FREE),
)
_KIND_CPU = {semconv.KIND_TOKENIZE: TOKENIZERS, semconv.KIND_SERIALIZE: JSON_ENCODE}


@dataclass(frozen=True)
class StageCode:
    """The code behind a stage, as far as the trace shows it.

    Attributes:
        stage: the stage name (``None``: the request's own code outside any stage).
        kind: the stage kind, if known.
        function: ``code.namespace + "." + code.function``, if known.
        qualname: ``code.function`` (the callable's ``__qualname__``), if known.
        shape: one of ``semconv.STAGE_SHAPES``, or ``None`` (a trace older than it).
        blocked_at: where the watchdog caught it holding the loop, if it did.
        frames: the library frames it was running there (innermost first, one per line).
        hot: the hottest functions of a typical pyinstrument profile of it (the median by
            sampled time; ``tracekit.profile.hot``, tracekit.integrations.pyinstrument), if any.
        profiled_ms: that profile's sampled time.
        profiles: how many of its calls were profiled.
        holds_gil: whether its call holds the GIL throughout, where an integration recorded
            it (``tracekit.holds_gil``: measured per library method), else ``None``.
    """

    stage: str | None
    kind: str | None = None
    function: str | None = None
    qualname: str | None = None
    shape: str | None = None
    blocked_at: str | None = None
    frames: str | None = None
    hot: str | None = None
    profiled_ms: float = 0.0
    profiles: int = 0
    holds_gil: bool | None = None

    @classmethod
    def of(cls, stage: str | None, records: Iterable[StageRecord | None]) -> StageCode:
        """The code of ``stage`` from its records on a route: the function that ran the most
        CPU (one stage name can wrap several functions: ``complete`` and
        ``stream_completion`` both as ``model``), with the first catch that has frames.

        Args:
            stage: the stage name (``None``: the request's own code).
            records: its records (``None`` entries, e.g. the request's own code, are skipped).
        """
        cpu: dict[tuple[str | None, str | None], float] = {}
        first: dict[tuple[str | None, str | None], StageRecord] = {}
        profiles: list[tuple[float, str]] = []
        for record in records:
            if record is None:
                continue
            profile = _profile(record)
            if profile is not None:
                profiles.append(profile)
            key = (function_of(record), record.shape)
            cpu[key] = cpu.get(key, 0.0) + (record.cpu_ms or 0.0)
            best = first.get(key)
            if best is None or _evidence(record) > _evidence(best):
                first[key] = record
        # A typical call's profile: the median by sampled time (the largest, quoted before,
        # was an outlier in a user's trial: 124 ms among profiles of ~20 ms).
        profiled, hot = sorted(profiles)[len(profiles) // 2] if profiles else (0.0, None)
        if not cpu:
            return cls(stage)
        key = max(cpu, key=lambda k: (cpu[k], str(k)))
        record = first[key]
        holds_gil = record.attributes.get(semconv.HOLDS_GIL)
        return cls(
            stage=stage,
            kind=record.kind,
            function=key[0],
            qualname=record.code_function,
            shape=record.shape,
            blocked_at=record.blocked_at,
            frames=record.blocked_frames,
            hot=hot,
            profiled_ms=profiled,
            profiles=len(profiles),
            holds_gil=holds_gil if isinstance(holds_gil, bool) else None,
        )

    def profile_note(self) -> str:
        """``"; pyinstrument: most self time in f (app.py:3) self 40 ms, total 41 ms of 45 ms
        sampled"`` when a profile of the stage was recorded, else ``""``."""
        if not self.hot:
            return ""
        typical = "a profiled call" if self.profiles < 2 else f"the median of {self.profiles} profiled calls"
        return (f"; pyinstrument ({typical}, {self.profiled_ms:.0f} ms sampled): most self time "
                f"in {hottest(self.hot)}")  # fmt: skip

    @property
    def tokenizers_seen(self) -> bool:
        """Whether the trace shows HF tokenizers running (its integration recorded the call's
        ``tracekit.holds_gil``, or the watchdog caught a ``tokenizers/`` frame), rather than
        only the stage's kind saying tokenize."""
        return self.holds_gil is not None or _TOKENIZERS_FRAME in (self.frames or "")

    @property
    def nested(self) -> bool:
        """Defined inside another function: a process pool cannot pickle it by reference."""
        return self.qualname is not None and "<locals>" in self.qualname

    @property
    def method(self) -> bool:
        """A method (``Class.method``): a pool would have to pickle its instance too."""
        return self.qualname is not None and "." in self.qualname and not self.nested

    @property
    def module_level(self) -> bool:
        """A module-level function: a process pool pickles it by reference."""
        return self.qualname is not None and "." not in self.qualname and "<" not in self.qualname

    @property
    def is_generator(self) -> bool:
        """An async or sync generator: its CPU runs between the items it yields."""
        return self.shape in (semconv.SHAPE_ASYNC_GENERATOR, semconv.SHAPE_GENERATOR)

    @property
    def callable_shape(self) -> bool:
        """A sync function (or, in a trace without shapes, a module-level function of a kind
        that is not a model call): a call a thread or a pool can take as it is."""
        if self.shape is not None:
            return self.shape == semconv.SHAPE_FUNCTION
        return self.module_level and self.kind != semconv.KIND_MODEL

    def shape_words(self) -> str:
        """The shape in words: "an async generator", "a method", ..."""
        if self.shape == semconv.SHAPE_ASYNC_GENERATOR:
            return "an async generator"
        if self.shape == semconv.SHAPE_GENERATOR:
            return "a generator"
        if self.shape == semconv.SHAPE_COROUTINE:
            return "an async method" if self.method else "a coroutine"
        if self.shape == semconv.SHAPE_BLOCK:
            return "a `with tracekit.stage(...)` block"
        if self.nested:
            return "a function defined inside another function"
        if self.method:
            return "a method"
        return "a function" if self.shape == semconv.SHAPE_FUNCTION else "code of unknown shape"


def hottest(hot: str) -> str:
    """The line of a profile's hottest functions (``tracekit.profile.hot``) to name: the first
    that is Python code, the code to change. A builtin ranked above it is named after it:
    pyinstrument books a builtin's time, and on a busy host the time the thread was
    descheduled in it, to the builtin, not to the function calling it."""
    lines = hot.splitlines() or [""]
    python = next((line for line in lines if _BUILTIN not in line), lines[0])
    return python if python == lines[0] else f"{python} (a builtin ranked first: {lines[0]})"


def _profile(record: StageRecord) -> tuple[float, str] | None:
    # (sampled ms, hottest functions) of the record's pyinstrument profile, if it has one.
    value = record.attributes.get(semconv.PROFILE_HOT)
    ms = record.attributes.get(semconv.PROFILE_MS)
    if not isinstance(value, str) or not value:
        return None
    return (float(ms) if isinstance(ms, (int, float)) else 0.0), value


def _evidence(record: StageRecord) -> tuple[bool, bool]:
    # A record the watchdog caught, better one with library frames: what its code runs.
    return record.blocked_at is not None, record.blocked_frames is not None


def cpu_of(code: StageCode) -> tuple[str, str]:
    """What the stage's CPU is, and the evidence for it in words.

    Args:
        code: the stage's code.

    Returns:
        ``(what, why)``: one of the constants of this module, and a phrase such as
        ``"caught running json/decoder.py:353 in raw_decode"`` or
        ``"a tokenize stage: assumed HF tokenizers"``.
    """
    frames = code.frames or ""
    for marker, what in _FRAME_CPU:
        if marker in frames:
            line = next(f for f in frames.splitlines() if marker in f)
            return what, f"caught running {line}"
    assumed = _KIND_CPU.get(code.kind or "")
    if assumed is not None:
        library = "HF tokenizers" if assumed == TOKENIZERS else "JSON encoding"
        return assumed, f"a {code.kind} stage: assumed {library}"
    if code.blocked_at and not is_import_site(code.blocked_at) and not code.frames:
        # Caught in the application's own frame with no library below it: Python code.
        return PYTHON, f"caught running its own Python code at {code.blocked_at}"
    if code.frames:
        return PYTHON, f"caught running {code.frames.splitlines()[0]}"
    return UNKNOWN, "no sample of what it runs"
