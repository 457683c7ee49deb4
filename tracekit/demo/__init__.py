"""``tracekit demo`` (:mod:`tracekit.demo.runner`): the demo gateway (:mod:`.gateway`) and the
simulated model server (:mod:`.model_server`) under load. Importing this package imports
nothing."""
