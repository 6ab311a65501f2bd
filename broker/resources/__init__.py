"""Memory and disk: the alarms, the queues' memory budget, what the operating system reports."""
