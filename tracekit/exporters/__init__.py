"""SpanExporters tracekit ships: OTLP JSON Lines, console, memory."""
