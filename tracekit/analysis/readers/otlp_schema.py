"""OTLP JSON's shape as msgspec structs, and the decoders the OTLP reader uses.

The structs hold only the fields :mod:`tracekit.analysis.readers.otlp` reads, in the proto3
JSON mapping's names; msgspec checks every type as it decodes and skips unknown fields in C.
Lax mode (``strict=False``) reads the numbers proto3 JSON may give as strings. The ``Raw*``
variants keep each span (and resource) as raw JSON, a view of the input, for decoding span
by span.
"""

from __future__ import annotations

import msgspec
from msgspec import UNSET, Raw, Struct, UnsetType

__all__ = [
    "ABSENT", "CONTAINERS", "ENVELOPE", "JSON_CHECK", "LINE", "NULL", "RESOURCE", "SPAN",
    "AnyValue", "KeyValue", "OtlpEvent", "OtlpSpan", "RawResourceSpans", "Resource",
]  # fmt: skip


class AnyValue(Struct, gc=False, forbid_unknown_fields=True):
    doubleValue: float | UnsetType = UNSET
    stringValue: str | UnsetType = UNSET
    intValue: int | UnsetType = UNSET
    boolValue: bool | UnsetType = UNSET
    arrayValue: ArrayValue | UnsetType = UNSET
    kvlistValue: KeyValueList | UnsetType = UNSET
    bytesValue: str | UnsetType = UNSET  # base64 text, kept as given


class ArrayValue(Struct, gc=False):
    values: list[AnyValue] | None = None


class KeyValueList(Struct, gc=False):
    values: list[KeyValue] | None = None


class KeyValue(Struct, gc=False):
    key: str
    value: AnyValue


class OtlpEvent(Struct, gc=False):
    timeUnixNano: int = 0
    name: str = ""
    attributes: list[KeyValue] | None = None


class Status(Struct, gc=False):
    code: int | str | None = None


class OtlpSpan(Struct, gc=False, kw_only=True):
    # In the order the OTel SDKs and tracekit's exporter write them.
    traceId: str
    spanId: str
    name: str = ""
    kind: int | str | None = 0
    startTimeUnixNano: int
    endTimeUnixNano: int
    attributes: list[KeyValue] | None = None
    parentSpanId: str | None = None
    events: list[OtlpEvent] | None = None
    status: Status | None = None


class Resource(Struct, gc=False):
    attributes: list[KeyValue] | None = None


class ScopeSpans(Struct, gc=False):
    spans: list[OtlpSpan] | None = None


class ResourceSpans(Struct, gc=False):
    resource: Resource | None = None
    scopeSpans: list[ScopeSpans] | UnsetType | None = UNSET
    # The name before OTLP 0.15, still written by old SDKs.
    instrumentationLibrarySpans: list[ScopeSpans] | None = None


class Envelope(Struct, gc=False):
    resourceSpans: list[ResourceSpans] | UnsetType | None = UNSET


class TracesData(Struct, gc=False):
    resourceSpans: list[ResourceSpans] | UnsetType | None = UNSET
    result: Envelope | UnsetType = UNSET  # the Jaeger API v3 envelope


# The same containers, each span (and resource) kept as raw JSON, a view of the input.
NULL = Raw(b"null")
ABSENT = Raw(b"")


class RawScopeSpans(Struct, gc=False):
    spans: list[Raw] | None = None


class RawResourceSpans(Struct, gc=False):
    resource: Raw = NULL
    scopeSpans: list[RawScopeSpans] | UnsetType | None = UNSET
    instrumentationLibrarySpans: list[RawScopeSpans] | None = None


class RawEnvelope(Struct, gc=False):
    resourceSpans: list[RawResourceSpans] | UnsetType | None = UNSET


class RawTracesData(Struct, gc=False):
    resourceSpans: list[RawResourceSpans] | UnsetType | None = UNSET
    result: Raw = ABSENT


LINE = msgspec.json.Decoder(TracesData, strict=False)
CONTAINERS = msgspec.json.Decoder(RawTracesData, strict=False)
ENVELOPE = msgspec.json.Decoder(RawEnvelope, strict=False)
SPAN = msgspec.json.Decoder(OtlpSpan, strict=False)
RESOURCE = msgspec.json.Decoder(Resource | None, strict=False)
JSON_CHECK = msgspec.json.Decoder(Raw)  # checks JSON, builds nothing
