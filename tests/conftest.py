"""Shared pytest configuration."""

pytest_plugins = ["tests.servers", "tests.rgw", "tests.pg", "tests.dist"]
