"""Meltano's own state tests, run against the add-on (see ``tests/e2e/test_meltano_own_tests.py``)."""
