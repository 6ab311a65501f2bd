"""Queues: the registry, delegate, the queue types, the queue process, streams, consumers, arguments."""
