"""Queue storage behind the BackingQueue interface. Knows nothing of AMQP or of broker/: it stores
opaque messages with the few fields it needs (size, persistence)."""
