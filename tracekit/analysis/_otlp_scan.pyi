"""Types of the C helper tracekit/analysis/_otlp_scan.c (the OTLP reader's line scanner)."""

from collections.abc import Callable
from typing import Any

def configure(span_type: type, shared: dict[str, str], share: Callable[[str], str],
              kinds: dict[object, str], share_max_chars: int, max_value_chars: int,
              max_attributes: int, max_array_items: int, cache_slots: int, /) -> None: ...  # fmt: skip
def scan(line: bytes, /) -> list[Any] | None: ...
