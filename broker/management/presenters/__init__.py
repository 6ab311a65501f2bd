"""Broker objects as the HTTP API shows them, one module per resource (queues, exchanges, bindings,
connections and channels, vhosts, users and permissions, the overview's counters, the other cluster members'
queues), with RabbitMQ's JSON field names (``messages_ready``, ``messages_unacknowledged``,
``message_stats``, ``consumers``, ...), and the rate sampler behind the ``*_details.rate`` fields (rates,
sampling).

Every field is read from a declared attribute of the object it describes (a queue's figures from
``Queue.figures()``, a connection's state from ``Reader.connection_state``, ...): a field the broker does not
have fails loudly here (and in mypy) instead of showing a default. The request handlers (broker/management/*.py)
call these; the presenters never read a request.
"""
