"""The operator commands' logic over any store: state commands, export/import, diffs, the fleet view, ``doctor``."""
