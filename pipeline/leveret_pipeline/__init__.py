"""Leveret's shipped data pipeline: Spark jobs over the broker's own streams.

``leveret-pipeline traffic`` (cli.py) turns the firehose — trace events kept in a stream bound to
``amq.rabbitmq.trace`` — into per-vhost, per-queue, per-minute traffic and latency (traffic.py), printed as a
summary and drawn as a PNG (picture.py). It reads through the connector of this distribution
(``format("leveret")``, pyspark_leveret), so it is also the connector's first real user.
"""

from __future__ import annotations

__all__: list[str] = []
