"""tracekit integrations, one module per framework. This package imports nothing:
import the module you need, e.g. ``from tracekit.integrations import httpx``."""
