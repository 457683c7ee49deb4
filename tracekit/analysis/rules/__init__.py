"""One module per rule id (DESIGN §4)."""
