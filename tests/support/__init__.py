"""What the tests share: processes that die with the run, free ports, waiting, the command line
in-process, and SDK clients for the emulators.

``tests/helpers.py``, ``tests/servers.py``, ``tests/rgw.py`` and ``tests/pg.py`` re-export what
moved here, so both import paths work.
"""
