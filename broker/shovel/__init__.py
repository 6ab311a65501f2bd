"""Dynamic shovels (RabbitMQ's rabbitmq_shovel plugin, ``shovel`` runtime parameters): move messages from a
queue (or an exchange, through a server-named queue) on one AMQP 0-9-1 broker to an exchange or queue on
another, with publisher confirms.

* definition.py — the parameter's validation and defaults, in RabbitMQ's words (pure);
* uri.py — ``amqp://`` / ``amqps://`` URIs: parsing, TLS options, credentials left out of what is shown;
* link.py — one AMQP 0-9-1 client connection with one channel, on the project's own codec (protocol/);
* worker.py — one shovel: connect, declare, consume, publish, ack on confirm, reconnect after a delay;
* supervisor.py — the node's shovels: started from the vhosts' parameters, their status, restart.
"""
