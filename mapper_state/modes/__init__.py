"""The two ways a run goes: the filter and ``run`` (the stream, the session and the children wired together)."""
