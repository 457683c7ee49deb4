"""Records and spans as compact bytes (msgpack), to keep many of them or send them between processes.

The parallel reader's workers keep their request sample packed (a quarter of the memory of
the objects) and send it, the spans they set aside and the assembly state they hand on as
bytes. msgspec encodes the model's Structs in C; the rare value msgpack cannot hold (an
integer beyond 64 bits in an attribute) falls back to pickle, so nothing is ever lost.

Cost: a few microseconds per request record each way.
"""

from __future__ import annotations

import pickle
from typing import Any, TypeVar

import msgspec

from tracekit.analysis.model import RequestRecord

__all__ = ["pack", "unpack"]

T = TypeVar("T")
_MSGPACK = b"m"
_PICKLE = b"p"
_ENCODER = msgspec.msgpack.Encoder()
_DECODERS: dict[Any, msgspec.msgpack.Decoder[Any]] = {
    RequestRecord: msgspec.msgpack.Decoder(RequestRecord)
}


def pack(obj: Any) -> bytes:
    """``obj`` (model Structs, dataclasses, plain data) as bytes for :func:`unpack`."""
    try:
        return _MSGPACK + _ENCODER.encode(obj)
    except (msgspec.EncodeError, OverflowError, TypeError):
        return _PICKLE + pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def unpack(data: bytes, kind: type[T] | Any) -> T:
    """The object :func:`pack` packed, typed as ``kind`` (e.g. ``list[Span]``)."""
    if data[:1] == _PICKLE:
        loaded: T = pickle.loads(data[1:])
        return loaded
    decoder = _DECODERS.get(kind)
    if decoder is None:
        decoder = _DECODERS[kind] = msgspec.msgpack.Decoder(kind)
    result: T = decoder.decode(memoryview(data)[1:])
    return result
