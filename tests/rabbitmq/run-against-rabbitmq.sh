#!/usr/bin/env bash
# Run the integration tests against a real RabbitMQ: tests that fail there are wrong, unless marked leveret_only.
set -euo pipefail
cd "$(dirname "$0")/../.."
port=${RABBITMQ_TEST_PORT:-5673}
url=$(bash tests/rabbitmq/start-rabbitmq.sh "$port")
trap 'bash tests/rabbitmq/stop-rabbitmq.sh "$port"' EXIT
LEVERET_TEST_AMQP_URL="$url" .venv/bin/python -m pytest tests/integration "$@"
