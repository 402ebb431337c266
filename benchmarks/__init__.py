"""The scoreboard: every promise of SPEC section 5 measured side by side with what a user
would pick instead (``cat``, Meltano, ``meltano-map-transform``, a bare shell pipeline).

Run ``make bench`` (``python -m benchmarks.run``); see ``benchmarks/run.py``.
"""
