"""The domain: lease and heartbeat, state document, bookmarks, checkpointer, history, session (no Meltano, no click)."""
