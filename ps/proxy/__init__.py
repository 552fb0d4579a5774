"""``ps-proxy``: the man-in-the-middle that corrupts values between workers and a server."""
