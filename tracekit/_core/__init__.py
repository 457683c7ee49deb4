"""The request path: what runs inside every traced request, kept cheap (compiled with mypyc
where built). Records each request as plain integers and ledgers; nothing here builds spans.

- ``clock``: the one clock seam (wall and thread-CPU time);
- ``current``: the context variable holding the innermost open ledger;
- ``ledger``: a stage's (or request's) ledger, its steps, and the split of its wall time;
- ``request_record``: the compact per-request record and its ids;
- ``event_loop``: per-thread step state, the loop's busy slices, the loop-wait estimator;
- ``driver``: drives a coroutine step by step, timing each resumption;
- ``stage_timing``: opening and closing stage ledgers and timing their code;
- ``generator_stages``: (async) generator stages;
- ``asgi``: the per-request ASGI bookkeeping behind the middleware;
- ``watchdog`` (and ``_slicewatch.c``): samples the loop thread's stack while a slice holds it;
- ``failsafe``: tracekit's own failures are logged once and never reach the application.
"""
