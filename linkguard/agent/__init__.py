"""linkguard.agent: the per-host daemon.

Consumes: port observations from a driver (:mod:`linkguard.drivers`), plans for this host from
the bus. Produces: port states and events (``monitor``: hold-down and damping, pure), routes in
linkguard's own table, the rail map file and acks (``applier``), all wired in ``daemon``.
"""
