"""``ps-keys``: the CURVE keys of a run."""
