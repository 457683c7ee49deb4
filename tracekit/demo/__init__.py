"""What ``tracekit demo`` will run (issue 17); today the simulated model server
(``model_server.py``). Importing this package imports nothing."""
