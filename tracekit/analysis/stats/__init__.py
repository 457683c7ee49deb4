"""Statistics of a stream of requests in bounded memory: per-route and per-stage figures
(``aggregate``, ``route_stats``), streaming percentiles (``quantiles``), interval arithmetic on a
request's stage tree (``intervals``), and model calls read as customers of one server
(``model_calls``); for ``tracekit compare``, each request's values per route
(``route_values``) and the confidence intervals of a change (``confidence``)."""
