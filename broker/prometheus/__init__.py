"""The Prometheus exporter and the runtime families RabbitMQ's dashboards read."""
