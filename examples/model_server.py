"""The simulated model server (``tracekit.demo.model_server``), runnable from a checkout:
python examples/model_server.py --port 8001 [--serial | --max-num-seqs N] [--batch-cost F]
    [--otlp-traces-endpoint URL]"""

from tracekit.demo.model_server import main

if __name__ == "__main__":
    main()
