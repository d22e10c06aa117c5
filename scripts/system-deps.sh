#!/usr/bin/env bash
# Install the Debian packages the test suite and the dev cluster need, only if they are missing.
set -euo pipefail
need=()
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
# PostgreSQL for the SQL offset storage tests (metaq.testing.postgres runs initdb/pg_ctl from here).
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || need+=(postgresql)
# ZooKeeper for cluster mode (metaq.devcluster.zookeeper runs its jar with the machine's Java).
[ -e /usr/share/java/zookeeper.jar ] || need+=(zookeeper)
# Chromium and its WebDriver for the dashboard's browser tests (metaq.testing.browser).
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
# Redis and NATS, the peers `metaq bench peers` measures metaq beside (and its test runs).
[ -x /usr/bin/redis-server ] || need+=(redis-server)
[ -x /usr/sbin/nats-server ] || command -v nats-server >/dev/null 2>&1 || need+=(nats-server)
# kcat (librdkafka's command-line client) for the Kafka listener's tests (tests/integration/kafka).
command -v kcat >/dev/null 2>&1 || need+=(kcat)
if ((${#need[@]})); then
  if [ "$(id -u)" != 0 ]; then
    echo "missing system packages: ${need[*]} (run as root or install them)" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi
