"""Who may do what: users, permissions, topic permissions, the login throttle, handshakes, TLS."""
