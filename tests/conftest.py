"""Shared pytest configuration."""

pytest_plugins = ["tests.servers", "tests.rgw"]
