"""The demo shipped with tracekit: a simulated model server and a gateway with the seeds'
problems, run by ``tracekit demo``. Importing this package imports nothing."""
