"""Hostile input and careless operation: escapes, special files, slow backends, dead collectors."""
