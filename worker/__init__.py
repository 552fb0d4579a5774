"""The worker role (gradient computation) and the evaluator (a read-only worker)."""
