"""The reference engine: a whole run in one process, bit-identical to the cluster."""
