"""A Leveret cluster on PostgreSQL: membership, shared definitions, other members' queues."""
