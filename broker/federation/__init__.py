"""Federation (RabbitMQ's rabbitmq_federation plugin, ``federation-upstream`` and ``federation-upstream-set``
runtime parameters, the policy keys of the same names): messages published to an exchange on an upstream
broker that match the bindings of its namesake here are brought here and published into it (exchange
federation); a queue here fetches from its upstream namesake while its consumers have nothing to take (queue
federation).

* definition.py — the two parameters' validation and defaults, in RabbitMQ's words (pure);
* plan.py — which (exchange, upstream) links a vhost's policies and parameters ask for (pure);
* link.py — one exchange link: upstream exchange and queue, bindings kept in step, consume, republish, ack;
* queue_link.py — one queue link: consume the upstream queue while the queue here has demand;
* supervisor.py — the node's links: reconciled with the vhosts' policies and parameters, their status;
* metrics.py — the ``leveret_federation_*`` Prometheus families.

The AMQP client connection is the shovel's (broker/shovel/link.py): both sides of a link are AMQP 0-9-1
connections, the downstream one to this node's own listener as a node-internal user.
"""
