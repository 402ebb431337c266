"""The chaos suite: faults on the wire, racing processes, frozen and killed holders, skewed
clocks, hostile input and secrets, each checked by what the stores hold afterwards.

``conftest.py`` documents the budget (``MAPPER_STATE_CHAOS``) and the figures it records.
"""
