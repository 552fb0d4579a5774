"""Shared core of the Byzantine-tolerant parameter server: no sockets, no processes."""
