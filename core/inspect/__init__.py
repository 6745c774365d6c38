"""``dyn inspect-kv``: what a KV index holds, read from its HTTP views (``dyn.core.kv.views``)
on a ``dyn indexer``, a frontend in kv mode or a ``dyn router``'s ``--system-port``.

- ``target``: finding the views (probing ``/workers`` then ``/kv/workers``, or a ``dyn indexer``
  in discovery) and reading them (``KvTarget``).
- ``snapshot``: ``KvSnapshot`` (the ``--json`` schema) and the arithmetic over the views' answers:
  per-worker blocks and occupancy, tree size and depth histogram, a request's overlap.
- ``metrics``: the hit rate and KV-event counts in the target's Prometheus text.
- ``prompt``: the token ids of ``--prompt`` / ``--messages``, made as a frontend makes them.
- ``view``: rich tables; ``command``: ``run_inspect`` (one inspection, or ``--watch``).

Import the submodule you need; this package imports nothing on its own.
"""
