"""The analyzer: readers -> assembly -> aggregation, rules, replay -> Report (see model.py)."""
