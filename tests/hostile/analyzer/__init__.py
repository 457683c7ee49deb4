"""Hostile input for the analyzer and the CLI: trace text, files, backends, messages."""
