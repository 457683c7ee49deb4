"""The demo gateway (``tracekit.demo.gateway``: the seeds' problems, a switch each), runnable
from a checkout, beside ``examples/model_server.py``::

    python examples/model_server.py --port 8001 --serial &
    OTEL_TRACES_EXPORTER=jsonl:traces.jsonl python examples/demo_gateway.py --port 8000 \\
        --model-url http://127.0.0.1:8001 [--fix tokenize --fix guardrail ...]
"""

from tracekit.demo.gateway import main

if __name__ == "__main__":
    main()
