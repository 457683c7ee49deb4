"""Hugging Face ``tokenizers``: a tokenizer's calls as ``tokenize`` stages.

::

    from tracekit.integrations.tokenizers import instrument

    tokenizer = instrument(Tokenizer.from_file("tokenizer.json"))  # the same object, instrumented

``encode``, ``encode_batch``, ``decode`` and ``decode_batch`` of that tokenizer become stages of
kind ``tokenize`` (``tokenizer.encode``, ...), timed like any sync stage (CPU on or off the loop,
the longest hold of the loop, the watchdog's stack), with their token count
(``tracekit.tokens``: ids produced, or ids decoded) and ``tracekit.holds_gil``: whether the
method holds the GIL for its whole call (:data:`HOLDS_GIL`, measured), which tells the
``cpu-on-loop`` rule whether a worker thread would take the work off the loop.

How: ``Tokenizer`` is a Rust class, but its instances take attributes (checked with tokenizers
0.15.2, the extra's oldest, and 0.23.3): the
four methods are replaced *on the instance* by wrappers, so ``isinstance`` checks, other
methods and attributes are untouched, and other tokenizers are not instrumented. A copy or a
pickle of the tokenizer is not instrumented (the wrappers are not part of its state).
:func:`uninstrument` removes them. ``transformers``' fast tokenizers keep the Rust one as
``hf_tokenizer._tokenizer``: instrument that.

Called outside a request, a method is a stage of its own, like any ``tracekit.stage``; where
nothing is recorded the wrapper only calls the method (cost: ``bench/tokenizers_overhead.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Final, TypeVar

try:
    import tokenizers
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "tracekit.integrations.tokenizers needs the tokenizers package: "
        "pip install 'tracekit[tokenizers]'"
    ) from exc

from tracekit import semconv
from tracekit._core import stage_timing
from tracekit._core.failsafe import internal_error
from tracekit._core.ledger import Site
from tracekit.errors import ConfigurationError

T = TypeVar("T")

#: Whether each method holds the GIL for its whole call, measured with tokenizers 0.23.3:
#: while it ran, a pure-Python thread made no progress for most of the call (``encode``,
#: ``decode``) or kept running (``encode_batch``, ``decode_batch``: the Rust code runs
#: without the GIL). ``tests/integrations/test_tokenizers.py::test_holds_gil_is_measured``
#: measures it again on the installed version.
HOLDS_GIL: Final[dict[str, bool]] = {
    "encode": True,
    "encode_batch": False,
    "decode": True,
    "decode_batch": False,
}
_MARK = "_tracekit_instrumented"


def _site(method: str) -> Site:
    site = Site(f"tokenizer.{method}", semconv.KIND_TOKENIZE, f"Tokenizer.{method}",
                "tokenizers", semconv.SHAPE_FUNCTION)  # fmt: skip
    site.template[semconv.HOLDS_GIL] = HOLDS_GIL[method]
    return site


_SITES: Final[dict[str, Site]] = {method: _site(method) for method in HOLDS_GIL}


def instrument(tokenizer: T) -> T:
    """Make ``tokenizer``'s encode/decode calls ``tokenize`` stages; returns ``tokenizer``.

    Args:
        tokenizer: a ``tokenizers.Tokenizer``. Instrumenting it twice changes nothing.

    Raises:
        ConfigurationError: ``tokenizer`` is not a ``tokenizers.Tokenizer``, or its class
            does not let its instances take attributes (an older tokenizers build).
    """
    if not isinstance(tokenizer, tokenizers.Tokenizer):
        raise ConfigurationError(
            f"instrument() takes a tokenizers.Tokenizer, not {type(tokenizer).__name__} "
            "(for a transformers tokenizer, instrument its ._tokenizer)"
        )
    if getattr(tokenizer, _MARK, False):
        return tokenizer
    try:
        for method, site in _SITES.items():
            original = getattr(tokenizer, method)
            setattr(tokenizer, method, _stage(original, site, _COUNTS[method]))
        setattr(tokenizer, _MARK, True)
    except AttributeError as exc:
        uninstrument(tokenizer)
        raise ConfigurationError(
            f"this tokenizers build ({tokenizers.__version__}) does not let a Tokenizer take "
            f"attributes ({exc}), so its calls cannot be instrumented"
        ) from None
    return tokenizer


def uninstrument(tokenizer: Any) -> None:
    """Give ``tokenizer`` its own methods back (nothing happens if it was not instrumented)."""
    for name in (*_SITES, _MARK):
        try:
            delattr(tokenizer, name)
        except AttributeError:
            pass


_Count = Callable[[tuple[Any, ...], dict[str, Any], Any], int]


def _stage(method: Callable[..., Any], site: Site, count: _Count) -> Callable[..., Any]:
    call_begin, call_end = stage_timing.call_begin, stage_timing.call_end

    @functools.wraps(method)
    def tokenize_stage(*args: Any, **kwargs: Any) -> Any:
        led = call_begin(site)
        if led is None:
            return method(*args, **kwargs)
        try:
            result = method(*args, **kwargs)
        except BaseException as exc:
            call_end(led, exc)
            raise
        try:
            led.set_attribute(semconv.TOKENS, count(args, kwargs, result))
        except Exception:
            internal_error("tokenizers token count")
        call_end(led, None)
        return result

    return tokenize_stage


# The tokens of a call: an Encoding's length is its number of ids (len() makes no list).
def _encoded(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
    return len(result)


def _batch_encoded(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
    return sum(map(len, result))


def _decoded(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
    return len(args[0] if args else kwargs["ids"])


def _batch_decoded(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
    return sum(map(len, args[0] if args else kwargs["sequences"]))


_COUNTS: Final[dict[str, _Count]] = {"encode": _encoded, "encode_batch": _batch_encoded,
                                      "decode": _decoded, "decode_batch": _batch_decoded}  # fmt: skip
