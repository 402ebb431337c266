"""The adapter at the edge: everything mapper-state does for Meltano, in four rooms.

- **The mapper plugin** (Meltano starts ``mapper-state`` between tap and target):
  :mod:`.policy` (the run's policy inside Meltano), :mod:`.keeper` (the lease kept until
  Meltano has written its state), :mod:`.about` (``--about``).
- **The state backend add-on** (Meltano loads it by its ``meltano.state_backends`` entry
  points): :mod:`.backend`, its schemes and settings :mod:`.backend_schemes` and
  :mod:`.backend_settings` (the ``meltano.settings`` entry points).
- **The whole-run lease** (a ``meltano run`` exclusive with the add-on alone):
  :mod:`.run_hook` (where it is armed, or why not), :mod:`.internals` (the Meltano internals
  it relies on, listed and checked), :mod:`.run_lease` (the leases held until Meltano exits).
- **Reading ``meltano.yml``** for the command line: :mod:`.project`.

Shared rules have one home: Meltano's environment, URI rules and the run's owner token in
:mod:`.env`; how an error reaches a Meltano user (one line, the busy hint, the add-on's
setting names) in :mod:`.refusal`; the TTL floor in :func:`.backend_schemes.floored_ttl`.
"""
