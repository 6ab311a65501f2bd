"""The HTTP API, shaped like RabbitMQ's management plugin (``/api/...`` on port 15672, basic auth with the
broker's users and their tags), one module per resource group; ``app.make_app`` puts them together."""
