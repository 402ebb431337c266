"""tap-sample: a small singer-sdk tap used by the mapper-state demo and tests."""

from tap_sample.tap import TapSample

__all__ = ["TapSample"]
