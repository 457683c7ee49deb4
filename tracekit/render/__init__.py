"""Report renderers: text, HTML (JSON is Report.to_dict)."""
