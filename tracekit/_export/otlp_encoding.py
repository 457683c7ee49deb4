"""OTLP protobuf encoding of SDK ``ReadableSpan`` batches, written as bytes directly.

The SDK's encoder (opentelemetry-exporter-otlp-proto-common) builds a protobuf message object
per span, attribute and value, in Python: on the export thread, holding the GIL, it costs
several times what building the span did. This module writes the same
``ExportTraceServiceRequest`` wire format straight into bytes, with each attribute key's
encoded prefix kept (and whole attributes whose string or integer values repeat:
stage names, routes, status codes), so that the export thread holds the GIL a fraction as long. It is
compiled with mypyc with the rest of span building.

What it does not encode itself (links, values of unusual types, ids or times out of range)
is encoded span by span with the SDK's encoder (a ``Span`` message serialized alone is the
same bytes as inside its parent), so every span comes out as the SDK would encode it;
tests/core/test_otlp_encoding.py compares the two, parsed back.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, Final

_PACK_DOUBLE: Final = struct.Struct("<d").pack
_PACK_FIXED64: Final = struct.Struct("<Q").pack
_PACK_FIXED32: Final = struct.Struct("<I").pack
_MAX_KEYS: Final = 4096  # encoded key prefixes kept (keys are few: tracekit's and the app's)
_U64: Final = 1 << 64
# Whole encoded attributes kept, for string and int values that repeat: keys, values a key,
# characters a string (at most ~2 MB of them each for strings and ints).
_KEYS_WITH_VALUES: Final = 256
_VALUES_KEPT: Final = 64
_LONGEST_KEPT: Final = 128


def varint(n: int) -> bytes:
    """A protobuf varint of ``0 <= n < 2**64`` (int64 values: two's complement first)."""
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag, the payload's length, the payload."""
    return tag + varint(len(payload)) + payload


def _string(tag: bytes, text: str) -> bytes:
    return _field(tag, text.encode("utf-8"))  # a lone surrogate: UnicodeEncodeError, the SDK's


class _Unusual(Exception):
    """A value this module leaves to the SDK's encoder."""


# AnyValue fields: string 1, bool 2, int 3, double 4, array 5 (kvlist 6, bytes 7: the SDK's).
def any_value(value: Any) -> bytes:
    """An ``AnyValue`` message's bytes."""
    kind = type(value)
    if kind is str:
        return _string(b"\x0a", value)
    if kind is float:
        return b"\x21" + _PACK_DOUBLE(value)
    if kind is bool:
        return b"\x10\x01" if value else b"\x10\x00"
    if kind is int:
        if not -(1 << 63) <= value < (1 << 63):
            raise _Unusual
        return b"\x18" + varint(value % _U64)
    if kind is list or kind is tuple:
        return _field(b"\x2a", b"".join([_field(b"\x0a", any_value(v)) for v in value]))
    raise _Unusual


class Encoder:
    """Encodes batches of spans; keeps the encoded key prefixes, resources and scopes."""

    def __init__(self) -> None:
        self._keys: dict[str, bytes] = {}  # key -> KeyValue's key field + AnyValue's tag
        self._doubles: dict[str, bytes] = {}  # key -> a whole attribute field but the double
        # key -> value -> the whole attribute field (ints and strings apart: 1 == True == 1.0)
        self._strings: dict[str, dict[Any, bytes]] = {}
        self._ints: dict[str, dict[Any, bytes]] = {}
        self._resources: dict[int, tuple[Any, bytes]] = {}  # id -> (resource, Resource field)
        self._scopes: dict[int, tuple[Any, bytes]] = {}

    def attributes(self, tag: bytes, attributes: Any) -> bytes:
        """Every attribute as a repeated ``KeyValue`` field ``tag``."""
        if not attributes:
            return b""
        parts: list[bytes] = []
        span = tag == b"\x4a"
        doubles = self._doubles
        for key, value in attributes.items():
            kind = type(value)
            if span and kind is float:  # a fresh value each span: only its prefix is kept
                prefix = doubles.get(key)
                if prefix is None:
                    prefix = self._double_prefix(key)
                parts.append(prefix + _PACK_DOUBLE(value))
                continue
            if span and (kind is str or kind is int):  # names, routes, counts: they repeat
                seen = (self._strings if kind is str else self._ints).get(key)
                if seen is not None:
                    field = seen.get(value)
                    if field is not None:
                        parts.append(field)
                        continue
                field = self._attribute(tag, key, value)
                self._keep(kind is str, key, value, field)
                parts.append(field)
                continue
            parts.append(self._attribute(tag, key, value))
        return b"".join(parts)

    def _attribute(self, tag: bytes, key: Any, value: Any) -> bytes:
        """One ``KeyValue`` field ``tag``."""
        head = self._keys.get(key)
        if head is None:
            if type(key) is not str:
                raise _Unusual
            head = _string(b"\x0a", key) + b"\x12"
            if len(self._keys) < _MAX_KEYS:
                self._keys[key] = head
        any_bytes = any_value(value)
        return _field(tag, head + varint(len(any_bytes)) + any_bytes)

    def _keep(self, text: bool, key: str, value: Any, field: bytes) -> None:
        """Keep an encoded string or int attribute of a span (a few values a key)."""
        kept = self._strings if text else self._ints
        values = kept.get(key)
        if values is None:
            if len(kept) >= _KEYS_WITH_VALUES:
                return
            values = kept[key] = {}
        if len(values) < _VALUES_KEPT and (not text or len(value) <= _LONGEST_KEPT):
            values[value] = field

    def _double_prefix(self, key: str) -> bytes:
        if type(key) is not str:
            raise _Unusual
        key_field = _string(b"\x0a", key)
        prefix = b"\x4a" + varint(len(key_field) + 11) + key_field + b"\x12\x09\x21"
        if len(self._doubles) < _MAX_KEYS:
            self._doubles[key] = prefix
        return prefix

    def span(self, span: Any) -> bytes:
        """One ``Span`` message's bytes (as the SDK's ``_encode_span`` serializes)."""
        try:
            return self._span(span)
        except (_Unusual, OverflowError, struct.error, UnicodeEncodeError):
            from opentelemetry.exporter.otlp.proto.common._internal.trace_encoder import _encode_span

            data: bytes = _encode_span(span).SerializePartialToString()
            return data

    def _span(self, span: Any) -> bytes:
        if span.links:
            raise _Unusual
        context = span.context
        parent = span.parent
        parts = [b"\x0a\x10" + context.trace_id.to_bytes(16, "big"),
                 b"\x12\x08" + context.span_id.to_bytes(8, "big")]  # fmt: skip
        trace_state = context.trace_state
        if trace_state:
            parts.append(_string(b"\x1a", ",".join([f"{k}={v}" for k, v in trace_state.items()])))
        if parent is not None:
            parts.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
        parts.append(_string(b"\x2a", span.name))
        kind = span.kind.value + 1  # OTLP numbers kinds from 1 (INTERNAL); the API from 0
        parts.append(b"\x30" + varint(kind))
        start, end = span.start_time, span.end_time
        if start:
            parts.append(b"\x39" + _PACK_FIXED64(start))
        if end:
            parts.append(b"\x41" + _PACK_FIXED64(end))
        parts.append(self.attributes(b"\x4a", span.attributes))
        dropped = span.dropped_attributes
        if dropped:
            parts.append(b"\x50" + varint(dropped))
        for event in span.events:
            event_parts = [b"\x09" + _PACK_FIXED64(event.timestamp) if event.timestamp else b"",
                           _string(b"\x12", event.name) if event.name else b"",
                           self.attributes(b"\x1a", event.attributes)]  # fmt: skip
            if event.dropped_attributes:
                event_parts.append(b"\x20" + varint(event.dropped_attributes))
            parts.append(_field(b"\x5a", b"".join(event_parts)))
        if span.dropped_events:
            parts.append(b"\x60" + varint(span.dropped_events))
        if span.dropped_links:
            parts.append(b"\x70" + varint(span.dropped_links))
        status = span.status
        code = status.status_code.value
        message = status.description
        parts.append(_field(b"\x7a", (_string(b"\x12", message) if message else b"")
                            + (b"\x18" + varint(code) if code else b"")))  # fmt: skip
        flags = 0x300 if parent is not None and parent.is_remote else 0x100
        parts.append(b"\x85\x01" + _PACK_FIXED32(flags))
        return b"".join(parts)

    def _resource(self, resource: Any) -> bytes:
        """The ``ResourceSpans.resource`` field of ``resource`` (kept: resources do not change)."""
        kept = self._resources.get(id(resource))
        if kept is not None and kept[0] is resource:
            return kept[1]
        try:
            encoded = _field(b"\x0a", self.attributes(b"\x0a", resource.attributes))
        except (_Unusual, OverflowError, UnicodeEncodeError):
            from opentelemetry.exporter.otlp.proto.common._internal import _encode_resource

            encoded = _field(b"\x0a", _encode_resource(resource).SerializePartialToString())
        if len(self._resources) > 16:
            self._resources.clear()
        self._resources[id(resource)] = (resource, encoded)
        return encoded

    def _scope(self, scope: Any) -> bytes:
        """The ``ScopeSpans.scope`` field of ``scope``."""
        kept = self._scopes.get(id(scope))
        if kept is not None and kept[0] is scope:
            return kept[1]
        from opentelemetry.exporter.otlp.proto.common._internal import (
            _encode_instrumentation_scope,
        )

        encoded = _field(b"\x0a", _encode_instrumentation_scope(scope).SerializePartialToString())
        if len(self._scopes) > 64:
            self._scopes.clear()
        self._scopes[id(scope)] = (scope, encoded)
        return encoded

    def encode(self, spans: Sequence[Any]) -> bytes:
        """An ``ExportTraceServiceRequest``'s bytes: spans grouped by resource, then scope, in
        the order each first appears (as the SDK's encoder groups them)."""
        # Grouped by identity first: hashing a Resource or a scope serializes its attributes.
        groups: dict[int, tuple[Any, dict[int, tuple[Any, list[bytes]]]]] = {}
        for span in spans:
            resource = span.resource
            group = groups.get(id(resource))
            if group is None:
                group = groups[id(resource)] = (resource, {})
            scope = span.instrumentation_scope or None
            by_scope = group[1].get(id(scope))
            if by_scope is None:
                by_scope = group[1][id(scope)] = (scope, [])
            by_scope[1].append(_field(b"\x12", self.span(span)))
        out: list[bytes] = []
        for resource, scopes in _merge_equal(list(groups.values())):
            scope_spans: list[bytes] = []
            for scope, encoded in _merge_equal(list(scopes.values())):
                scope_field = self._scope(scope) if scope is not None else b"\x0a\x00"
                schema = scope.schema_url if scope is not None else None
                tail = _string(b"\x1a", schema) if schema else b""
                scope_spans.append(_field(b"\x12", scope_field + b"".join(encoded) + tail))
            schema = resource.schema_url
            tail = _string(b"\x1a", schema) if schema else b""
            out.append(_field(b"\x0a", self._resource(resource) + b"".join(scope_spans) + tail))
        return b"".join(out)


def _merge_equal(groups: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """``groups`` (key, members) with the members of equal keys joined under the first
    (distinct objects that compare equal: the SDK groups by equality)."""
    if len(groups) < 2:
        return groups
    merged: list[tuple[Any, Any]] = []
    for key, members in groups:
        for other_key, other in merged:
            if other_key == key:
                if isinstance(other, dict):
                    for scope_id, (scope, encoded) in members.items():
                        kept = other.get(scope_id)
                        if kept is None:
                            other[scope_id] = (scope, encoded)
                        else:
                            kept[1].extend(encoded)
                else:
                    other.extend(members)
                break
        else:
            merged.append((key, members))
    return merged
