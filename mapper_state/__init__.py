"""mapper-state: Singer pipeline state in a remote store, one run per pipeline at a time."""

__version__ = "0.1.0"
