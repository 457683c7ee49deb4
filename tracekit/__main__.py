"""``python -m tracekit``: the command line (see :mod:`tracekit.cli`)."""

from __future__ import annotations

import sys

from tracekit.cli import main

if __name__ == "__main__":
    sys.exit(main())
