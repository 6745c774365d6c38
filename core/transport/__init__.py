"""dyn.core.transport: ZMQ sockets and framing for the request plane and the event plane."""
