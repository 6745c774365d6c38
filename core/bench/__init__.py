"""``dyn bench``: workloads, trace formats, the load client, offline replay, metrics and reports."""
