"""Types of the C helper tracekit/analysis/_otlp_attributes.c (the OTLP reader's attribute loop)."""

from collections.abc import Callable
from typing import Any

def configure(kv_type: type, value_type: type, array_type: type, scalar_type: type, unset: object,
              shared: dict[str, str], share: Callable[[str], str], rest: Callable[[Any], Any],
              /) -> None: ...  # fmt: skip
def attributes(kvs: list[Any], /) -> dict[str, Any]: ...
