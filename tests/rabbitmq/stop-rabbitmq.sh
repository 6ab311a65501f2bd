#!/usr/bin/env bash
# Stop the reference RabbitMQ node started by start-rabbitmq.sh.
set -euo pipefail
port=${1:-5673}
base=/tmp/leveret-rabbitmq-$port
[ -f "$base/env" ] || exit 0
su rabbitmq -s /bin/bash -c ". $base/env; cd $base; HOME=/var/lib/rabbitmq /usr/lib/rabbitmq/bin/rabbitmqctl -n \$RABBITMQ_NODENAME stop" >/dev/null 2>&1 || true
