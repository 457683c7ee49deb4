"""``tracekit.configure()``: where spans go. Arguments > ``OTEL_*`` environment > defaults.

- Called again (its provider still the global one), it replaces the exporters it added to
  that provider: every span goes to the new ones, once. The provider's resource and sampler
  stay (OpenTelemetry lets no one replace a global provider): a different ``service_name``
  is said in a warning and not applied.
- Never replaces a tracer provider the application already installed: if the global
  provider is an SDK ``TracerProvider``, tracekit's spans join it (its processors, resource
  and sampler); an explicitly requested ``exporter=`` is added for tracekit's spans only.
- Otherwise it creates an SDK provider (resource from ``service_name`` / ``OTEL_SERVICE_NAME``
  / ``OTEL_RESOURCE_ATTRIBUTES``, sampler from ``OTEL_TRACES_SAMPLER``) and installs it as the
  global one, so other instrumentation (httpx, ...) shares the trace. FastAPI >= 0.165 turns
  its native telemetry on when a global provider exists: tracekit then enriches FastAPI's
  server span, records FastAPI's spans in the same trace, and logs a warning once
  (docs/composition.md).
- Exporters: ``otlp`` (http/protobuf; grpc with ``otlp-grpc`` or
  ``OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL=grpc``; endpoint and headers from the standard
  ``OTEL_EXPORTER_OTLP_*`` variables), ``jsonl:PATH`` (OTLP JSON Lines), ``console``,
  ``memory``, ``none``, or any SDK ``SpanExporter`` instance, or several at once (a list, or
  comma-separated names, as ``OTEL_TRACES_EXPORTER`` takes them): every entry is honoured or
  the configuration refused, never one silently dropped. Network exporters run behind a
  ``BatchSpanProcessor``: export happens on its thread, a slow or dead collector only fills
  (then overflows) its bounded queue and never delays a response.
- Shutdown is bounded: when the server stops and at exit, tracekit waits for the export at
  most ``shutdown_timeout_ms`` (``TRACEKIT_SHUTDOWN_TIMEOUT_MS``, default 5000), then logs
  once how many spans were never exported (:mod:`tracekit._export.shutdown`).
- Privacy (docs/attributes.md, "Privacy"): ``url.query`` values of sensitive keys are
  redacted, exception messages cut to 256 characters; both adjustable (``TRACEKIT_RECORD_QUERY``,
  ``TRACEKIT_REDACT_QUERY``, ``TRACEKIT_EXCEPTION_MESSAGE_LIMIT``).

The SDK is imported here, lazily: ``import tracekit`` does not load it.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from tracekit._core import current
from tracekit._export import shutdown, tracing
from tracekit._export.span_attributes import DEFAULT_MESSAGE_LIMIT, Privacy
from tracekit.errors import ConfigurationError

T = TypeVar("T")

logger = logging.getLogger("tracekit")

EXPORTERS = ("otlp", "otlp-http", "otlp-grpc", "jsonl:PATH", "console", "memory", "none")
DEFAULT_BLOCK_THRESHOLD_MS = 20.0


def configure(service_name: str | None = None, exporter: Any = None, *,
              sampler: Any = None, block_threshold_ms: float | None = None,
              tracer_provider: Any = None, shutdown_timeout_ms: float | None = None,
              record_query: bool | None = None, redact_query: Iterable[str] | None = None,
              exception_message_limit: int | None = None) -> None:  # fmt: skip
    """Set where tracekit's spans go (see the module docstring for the precedence rules).

    Args:
        service_name: ``service.name`` of the resource (else ``OTEL_SERVICE_NAME``).
        exporter: one of ``otlp``, ``otlp-http``, ``otlp-grpc``, ``jsonl:PATH``, ``console``,
            ``memory``, ``none``, or an SDK ``SpanExporter``; or several: a list, or names
            separated by commas (``"otlp,jsonl:traces.jsonl"``); default
            ``OTEL_TRACES_EXPORTER`` (comma-separated too), else ``otlp``.
        sampler: an SDK ``Sampler``; default from ``OTEL_TRACES_SAMPLER``(``_ARG``).
        block_threshold_ms: the watchdog samples the loop's stack when one slice holds it
            longer than this (default 20 ms; ``TRACEKIT_BLOCK_THRESHOLD_MS``).
        tracer_provider: an SDK ``TracerProvider`` to join instead of the global one.
        shutdown_timeout_ms: the longest tracekit waits for the export when the server stops
            and at exit; what is not exported by then is counted, logged once, and dropped
            (default 5000; ``TRACEKIT_SHUTDOWN_TIMEOUT_MS``; 0: never wait).
        record_query: record ``url.query`` at all (default true; ``TRACEKIT_RECORD_QUERY``).
        redact_query: query keys whose values are recorded as ``REDACTED``, besides the
            OpenTelemetry list (``sig``, ``X-Amz-Signature``, ...); ``"*"``: every value
            (``TRACEKIT_REDACT_QUERY``, comma-separated).
        exception_message_limit: characters of an exception's message recorded (status and
            exception event); 0 records the exception's type only (default 256;
            ``TRACEKIT_EXCEPTION_MESSAGE_LIMIT``).

    Raises:
        ConfigurationError: unknown exporter, bad threshold or option, or missing optional
            package.
    """
    timeout = _setting(shutdown_timeout_ms, "TRACEKIT_SHUTDOWN_TIMEOUT_MS", float,
                       shutdown.DEFAULT_SHUTDOWN_TIMEOUT_MS, _non_negative, "a number >= 0")  # fmt: skip
    privacy = privacy_for(record_query, redact_query, exception_message_limit)
    previous = current.active_runtime
    if previous is not None:  # its spans out first, to the exporters a new call may replace
        previous.flush(timeout)
    runtime = build_runtime(service_name, exporter, sampler, block_threshold_ms, tracer_provider,
                            privacy)  # fmt: skip
    shutdown.shutdown_timeout_ms = timeout
    tracing.install(runtime)
    shutdown.register_exit()  # after the SDK provider's: runs before it
    if previous is not None:
        previous.shutdown()


def host_cpus() -> dict[str, int]:
    """The resource attributes of the gateway host's CPUs (the analyzer's replay reads them):
    ``tracekit.host.cpus``, the machine's logical CPUs, and ``tracekit.process.cpus``, those
    the process may run on (its CPU affinity, where the OS has one; a cgroup quota is not
    seen). ``OTEL_RESOURCE_ATTRIBUTES`` overrides either."""
    from tracekit import semconv

    machine = os.cpu_count() or 1
    affinity = getattr(os, "sched_getaffinity", None)
    allowed = len(affinity(0)) if affinity is not None else machine
    return {semconv.HOST_CPUS: machine, semconv.PROCESS_CPUS: max(1, allowed)}


def runtime_for(tracer_provider: Any, service_name: str | None) -> tracing.Runtime:
    """The runtime a middleware uses when it finds none configured (first request)."""
    if tracer_provider is not None:
        return build_runtime(service_name, None, None, None, tracer_provider)
    if current.active_runtime is None:
        configure(service_name=service_name)
    runtime: tracing.Runtime = current.active_runtime
    return runtime


def build_runtime(service_name: str | None, exporter: Any, sampler: Any,
                  block_threshold_ms: float | None, tracer_provider: Any,
                  privacy: Privacy | None = None) -> tracing.Runtime:  # fmt: skip
    """A runtime per the rules above (not installed); ``privacy``: from the environment if None."""
    from opentelemetry import trace as otel_trace
    from opentelemetry.sdk.trace import TracerProvider

    from tracekit._core.watchdog import Watchdog

    threshold = _threshold(block_threshold_ms)
    if _env_true("OTEL_SDK_DISABLED"):
        logger.info("tracekit: OTEL_SDK_DISABLED is true; tracing is off")
        return tracing.Runtime(None, None, None, threshold)
    provider = tracer_provider
    if provider is None:
        candidate = otel_trace.get_tracer_provider()
        provider = candidate if isinstance(candidate, TracerProvider) else None
    elif not isinstance(provider, TracerProvider):
        raise ConfigurationError("tracer_provider must be an OpenTelemetry SDK TracerProvider")
    if provider is not None and tracer_provider is None and provider in _added:  # configure()'s own
        runtime = _reconfigure(provider, service_name, exporter, sampler, threshold)
    elif provider is not None:  # join the application's provider, never replace it
        from tracekit._export import sdk

        processor: Any = sdk.active_processor(provider)
        if exporter is not None:
            extra = _processors_for(exporter, "exporter")
            processor = _FanOut([p for p in (processor, *extra) if p is not None])
        from opentelemetry.sdk.resources import Resource

        # The application's resource, with the host's CPUs the replay reads (its own win).
        resource = Resource(host_cpus()).merge(provider.resource)
        runtime = tracing.Runtime(processor, resource, sampler or provider.sampler, threshold)
    else:
        from opentelemetry.sdk.resources import Resource

        from tracekit._export import sdk

        named = Resource.create({"service.name": service_name} if service_name else {})
        resource = Resource(host_cpus()).merge(named)  # OTEL_RESOURCE_ATTRIBUTES wins
        processors = _exporter_processors(exporter)
        provider = TracerProvider(resource=resource, sampler=sampler)
        for one in processors:
            provider.add_span_processor(one)
        _added[provider] = processors
        processor = _one_or_chain(processors, sdk.active_processor(provider))
        otel_trace.set_tracer_provider(provider)
        if otel_trace.get_tracer_provider() is provider:  # (set once: another may have won)
            from tracekit._export import composition

            composition.configured_chains.add(sdk.active_processor(provider))
        runtime = tracing.Runtime(processor, resource, provider.sampler, threshold, owns_processor=False)
    runtime.watchdog = Watchdog(threshold)
    runtime.privacy = privacy if privacy is not None else privacy_for(None, None, None)
    return runtime


# The span processors configure() added to each tracer provider it made (to replace them
# when it is called again).
_added: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()


def _reconfigure(provider: Any, service_name: str | None, exporter: Any, sampler: Any,
                 threshold: float) -> tracing.Runtime:  # fmt: skip
    """configure() again: the exporters it added to its own (global) provider give way to this
    call's (the old ones shut down within the shutdown timeout); the resource and the
    provider's sampler stay (a global provider is set once)."""
    import time

    from tracekit._export import sdk

    named = provider.resource.attributes.get("service.name")
    if service_name is not None and service_name != named:
        logger.warning(
            "tracekit: configure() was called again with service_name=%r; the service name "
            "stays %r (the tracer provider the first call installed keeps its resource, and "
            "OpenTelemetry lets no one replace it): call configure() once, at start-up",
            service_name, named,
        )  # fmt: skip
    processors = _exporter_processors(exporter)
    chain = sdk.active_processor(provider)
    retired = _added.get(provider, [])
    sdk.replace_processors(chain, retired, processors)
    _added[provider] = processors
    deadline = time.monotonic() + shutdown.shutdown_timeout_ms / 1000
    for one in retired:  # their pending spans exported; a dead collector holds no caller
        shutdown.bounded(one.shutdown, deadline, "exporter shutdown")
    return tracing.Runtime(_one_or_chain(processors, chain), provider.resource,
                           sampler or provider.sampler, threshold, owns_processor=False)  # fmt: skip


def _exporter_processors(exporter: Any) -> list[Any]:
    """The span processors of ``exporter``, else of ``OTEL_TRACES_EXPORTER``, else OTLP."""
    if exporter is not None:
        return _processors_for(exporter, "exporter")
    return _processors_for(os.environ.get("OTEL_TRACES_EXPORTER") or "otlp", "OTEL_TRACES_EXPORTER")


def _one_or_chain(processors: list[Any], chain: Any) -> Any:
    """What tracekit hands its spans to: none, one exporter's processor, or for several the
    provider's chain of them."""
    if not processors:
        return None
    return processors[0] if len(processors) == 1 else chain


def privacy_for(record_query: bool | None, redact_query: Iterable[str] | None,
                exception_message_limit: int | None) -> Privacy:  # fmt: skip
    """The privacy options: arguments > ``TRACEKIT_*`` environment > defaults."""
    if isinstance(redact_query, (str, bytes)):
        raise ConfigurationError("redact_query must be a list of query keys, not a string")
    if redact_query is not None and not all(isinstance(key, str) for key in redact_query):
        raise ConfigurationError("redact_query must be a list of strings")
    keys = redact_query if redact_query is not None else _env_keys("TRACEKIT_REDACT_QUERY")
    return Privacy(
        _setting(record_query, "TRACEKIT_RECORD_QUERY", _boolean, True, _is_bool, "true or false"),
        keys,
        _setting(exception_message_limit, "TRACEKIT_EXCEPTION_MESSAGE_LIMIT", int,
                 DEFAULT_MESSAGE_LIMIT, _non_negative_int, "an integer >= 0"),
    )  # fmt: skip


def _setting(value: T | None, env: str, parse: Callable[[str], T], default: T,
             valid: Callable[[object], bool], what: str) -> T:  # fmt: skip
    """An option: the argument (a ConfigurationError if not ``what``), else the environment
    variable (one warning and the default if bad), else the default."""
    if value is not None:
        if not valid(value):
            name = env.removeprefix("TRACEKIT_").lower()
            raise ConfigurationError(f"{name} must be {what}, got {value!r}")
        return value
    raw = os.environ.get(env)
    if raw is None or not raw.strip():
        return default
    try:
        parsed = parse(raw.strip())
    except ValueError:
        parsed = None
    if parsed is None or not valid(parsed):
        logger.warning("tracekit: %s=%r is not %s; using %r", env, raw, what, default)
        return default
    return parsed


def _positive(value: object) -> bool:
    return _non_negative(value) and value != 0


def _non_negative(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


def _non_negative_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_bool(value: object) -> bool:
    return isinstance(value, bool)


def _boolean(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ValueError(raw)


def _env_keys(env: str) -> list[str]:
    return [key.strip() for key in os.environ.get(env, "").split(",") if key.strip()]


def _processors_for(exporter: Any, source: str) -> list[Any]:
    """Span processors for ``exporter``: one entry (a name or an SDK ``SpanExporter``), a
    list of them, or names separated by commas (as in ``OTEL_TRACES_EXPORTER``). Every entry
    is honoured or the whole is refused (``source`` names where it came from): an unknown
    or repeated entry, or ``none`` beside others, is a ConfigurationError."""
    items = exporter if isinstance(exporter, (list, tuple)) else [exporter]
    entries: list[Any] = []
    for item in items:
        if isinstance(item, str):
            entries.extend(part.strip() for part in item.split(","))
        else:
            entries.append(item)
    if not entries:
        raise ConfigurationError(f"{source}: no exporter given")
    names = [e.lower() if isinstance(e, str) and ":" not in e else e for e in entries]
    for i, name in enumerate(names):
        if name == "":
            raise ConfigurationError(f"{source}: an empty exporter entry in {exporter!r}")
        if name in names[:i]:
            raise ConfigurationError(f"{source}: exporter {entries[i]!r} is given twice")
    if "none" in names and len(names) > 1:
        raise ConfigurationError(f"{source}: 'none' cannot be combined with other exporters")
    try:
        return [p for p in map(_processor_for, entries) if p is not None]
    except ConfigurationError as exc:
        raise ConfigurationError(f"{source}: {exc}") from None


def _processor_for(exporter: Any) -> Any:
    """A span processor for an exporter name or instance (batching for network exporters)."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter

    from tracekit._export.batch import CountedBatchSpanProcessor

    if isinstance(exporter, SpanExporter):
        return CountedBatchSpanProcessor(exporter)
    if not isinstance(exporter, str):
        raise ConfigurationError(f"exporter must be a name or a SpanExporter, got {type(exporter).__name__}")
    name, _, arg = exporter.partition(":")
    name = name.strip().lower()
    if name == "none":
        return None
    if name == "jsonl":
        if not arg:
            raise ConfigurationError("exporter 'jsonl' needs a path: jsonl:PATH")
        from tracekit.exporters.jsonl import JsonLinesSpanExporter

        return SimpleSpanProcessor(JsonLinesSpanExporter(arg))
    if name == "console":
        import sys

        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        # sys.stdout as it is now (the SDK's default binds it when the SDK is first imported)
        return SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stdout))
    if name == "memory":
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        return SimpleSpanProcessor(InMemorySpanExporter())
    if name in ("otlp", "otlp-http", "otlp-grpc"):
        return CountedBatchSpanProcessor(_otlp_exporter(name))
    raise ConfigurationError(f"unknown exporter {exporter!r}; expected one of {', '.join(EXPORTERS)}")


def _otlp_exporter(name: str) -> Any:
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip()  # fmt: skip
    grpc = name == "otlp-grpc" or (name == "otlp" and protocol == "grpc")
    if grpc:
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise ConfigurationError(
                "OTLP over gRPC needs the grpc extra: pip install 'tracekit[grpc]'") from exc
        return OTLPSpanExporter()
    if protocol not in ("http/protobuf", "grpc"):
        logger.warning("tracekit: unsupported OTLP protocol %r; using http/protobuf", protocol)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter()


def _threshold(value: float | None) -> float:
    return float(_setting(value, "TRACEKIT_BLOCK_THRESHOLD_MS", float, DEFAULT_BLOCK_THRESHOLD_MS,
                          _positive, "a positive number"))  # fmt: skip


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() == "true"


class _FanOut:
    """Hands each span to several processors (the app's, plus an exporter asked for)."""

    def __init__(self, processors: list[Any]) -> None:
        self.processors = processors

    def on_end(self, span: Any) -> None:
        for processor in self.processors:
            processor.on_end(span)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return all(p.force_flush(timeout_millis) for p in self.processors)

    def shutdown(self) -> None:
        for processor in self.processors:
            processor.shutdown()
