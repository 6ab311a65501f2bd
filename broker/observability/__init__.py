"""What the broker records about itself: node-wide counters, logging, the firehose tracer."""
