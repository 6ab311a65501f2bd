"""Delayed messages: when a message is due, and the node's dispatcher over storage/delay/."""
