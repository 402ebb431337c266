"""The adapter at the edge: Meltano's environment and URI rules, its run policy, the lease keeper, ``--about``."""
