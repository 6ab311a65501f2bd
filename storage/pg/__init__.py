"""Leveret's cluster store on PostgreSQL: the schema and its migrations (schema.py, SCHEMA.md), a node's
membership and lease (cluster.py), the shared backing queue (backing_queue.py) and the workers that carry its
work to the server (workers.py)."""
