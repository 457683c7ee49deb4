"""From spans to requests: ``grouping`` gathers a stream of spans into traces in bounded
memory; ``request_records`` turns one trace's spans into request records (the span tree and
the ``tracekit.*`` attributes)."""
