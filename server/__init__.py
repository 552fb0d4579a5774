"""The server-node role: one process per model shard."""
