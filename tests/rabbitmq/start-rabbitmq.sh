#!/usr/bin/env bash
# Start a real RabbitMQ node as the reference for the integration tests, on its own ports and data directory.
#   tests/rabbitmq/start-rabbitmq.sh [AMQP_PORT]   (default 5673; prints the AMQP URL when the node is up)
#   tests/rabbitmq/stop-rabbitmq.sh  [AMQP_PORT]
# Installs rabbitmq-server with apt-get if it is missing. The Debian wrapper runs as the `rabbitmq` user,
# so the data directory is owned by it.
set -euo pipefail
port=${1:-5673}
if ! command -v rabbitmqctl >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null
  service rabbitmq-server stop >/dev/null 2>&1 || true
fi
base=/tmp/leveret-rabbitmq-$port
mkdir -p "$base/mnesia" "$base/log"
cat > "$base/rabbitmq.conf" <<CONF
listeners.tcp.default = 127.0.0.1:$port
loopback_users.guest = true
CONF
cat > "$base/env" <<ENV
export RABBITMQ_NODENAME=leveret-ref-$port@localhost
export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
export RABBITMQ_NODE_PORT=$port
export RABBITMQ_DIST_PORT=$((port + 20000))
export RABBITMQ_MNESIA_BASE=$base/mnesia
export RABBITMQ_LOG_BASE=$base/log
export RABBITMQ_CONFIG_FILE=$base/rabbitmq
export RABBITMQ_ENABLED_PLUGINS_FILE=$base/enabled_plugins
export RABBITMQ_PID_FILE=$base/pid
ENV
echo "[]." > "$base/enabled_plugins"
chown -R rabbitmq:rabbitmq "$base"
su rabbitmq -s /bin/bash -c ". $base/env; cd $base; nohup /usr/lib/rabbitmq/bin/rabbitmq-server > $base/log/stdout 2>&1 &"
for _ in $(seq 1 120); do
  if su rabbitmq -s /bin/bash -c ". $base/env; cd $base; HOME=/var/lib/rabbitmq /usr/lib/rabbitmq/bin/rabbitmqctl -n \$RABBITMQ_NODENAME await_startup" >/dev/null 2>&1; then
    echo "amqp://guest:guest@127.0.0.1:$port/%2F"
    exit 0
  fi
  sleep 1
done
echo "RabbitMQ did not start; see $base/log" >&2
exit 1
