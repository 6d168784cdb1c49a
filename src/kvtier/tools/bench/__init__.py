"""``kvtier bench``: workloads, engine runs and reports."""
