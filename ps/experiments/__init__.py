"""``ps-experiment``: the paper's experiments as a grid of cached, resumable cells."""
