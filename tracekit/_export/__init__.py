"""From finished request records to OpenTelemetry spans, and every contact with the OTel SDK.

- ``tracing``: the process-wide runtime: sampling, the hand-off queue, the span-building
  thread, delivery to the SDK's processors and to ``tracekit.record()``;
- ``active_span``: what OpenTelemetry sees as the current span while a request runs;
- ``span_attributes``: a finished record's span attributes (pure: no OpenTelemetry);
- ``readable_spans``: builds the SDK's ``ReadableSpan`` objects;
- ``sdk``: the few places tracekit relies on the SDK beyond its public API;
- ``shutdown``: the bounded flush when the server stops and at exit;
- ``batch``: the batch span processor configure() puts in front of a network exporter.
"""
