"""``ps-cluster``: a whole run as local processes, started, watched and stopped."""
