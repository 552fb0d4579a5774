"""``ps-doctor``: what this machine gives a run (CURVE's speed, the kernels, threads, GPUs)."""
