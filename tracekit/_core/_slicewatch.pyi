"""Types of the C helper tracekit/_core/_slicewatch.c (the watchdog's GIL-free poll)."""

from array import array

def wait(cells: tuple[array[int], ...], seen: array[int], control: array[int], threshold_ns: int,
         interval_ns: int, max_wait_ns: int, /) -> list[int]: ...  # fmt: skip
def now_ns() -> int: ...
