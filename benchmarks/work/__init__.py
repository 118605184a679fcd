"""Work the suites share: the items of the peer workloads, the JPEG shards."""
