"""The wire and its security: protocol, sockets and guards, keys, budgets, refusals."""
