"""Hostile conditions for the recorder: what the request path must survive unchanged."""
