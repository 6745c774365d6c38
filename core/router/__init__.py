"""Choosing a worker for each request: the worker pool fed by discovery and the routing policies
(round-robin, random, direct; the KV router implements the same interface)."""
