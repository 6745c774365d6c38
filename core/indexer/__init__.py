"""The standalone KV indexer (``dyn indexer``) and the client routers use to ask it.

- ``service``: ``IndexerService`` (one model's ``RadixIndexer`` fed by KV events, a ZMQ query
  socket) and the ``dyn indexer`` process (``serve_indexer``).
- ``http``: the read-only HTTP views (``IndexerHttpApp`` over any ``IndexView``), mountable
  elsewhere.
- ``client``: ``RemoteIndexer`` (``--use-remote-indexer``) and finding indexers in discovery.

Import the submodule you need; this package imports nothing on its own.
"""
