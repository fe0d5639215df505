"""A cluster of nodes on one metadata store and one bucket: stream ownership, reassignment, failover."""
