"""dyn.core.worker: the engine host (request plane, event publishing, discovery registration)."""
