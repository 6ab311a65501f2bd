"""Leveret's broker: the AMQP 0-9-1 message path from socket to queue and back (see DESIGN.md §1)."""

PRODUCT = "Leveret"
VERSION = "0.1.0"
