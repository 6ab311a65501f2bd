"""Exchange federation (RabbitMQ's rabbitmq_federation plugin, ``federation-upstream`` and
``federation-upstream-set`` runtime parameters, the policy keys of the same names applied to exchanges):
messages published to an exchange on an upstream broker that match the bindings of its namesake here are
brought here and published into it.

* definition.py — the two parameters' validation and defaults, in RabbitMQ's words (pure);
* plan.py — which (exchange, upstream) links a vhost's policies and parameters ask for (pure);
* link.py — one link: upstream exchange and queue, bindings kept in step, consume, republish, ack;
* supervisor.py — the node's links: reconciled with the vhosts' policies and parameters, their status;
* metrics.py — the ``leveret_federation_*`` Prometheus families.

The AMQP client connection is the shovel's (broker/shovel/link.py): both sides of a link are AMQP 0-9-1
connections, the downstream one to this node's own listener as a node-internal user.
"""
