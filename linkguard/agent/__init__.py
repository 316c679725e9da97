"""linkguard.agent: the per-host daemon.

Consumes: port observations from a driver (:mod:`linkguard.drivers`), plans for this host from
the bus. Produces: port states and events (``monitor``: hold-down and damping, pure; with
``usability``, ``readmission`` and ``portrecord``), the decisions on them and on plans and peer
routes (``core``: fast path, plan acceptance with a typed refusal; pure, returns ``effects``),
routes in linkguard's own table, the rail map file and acks (``applier``), each change of what
jobs see (``railmap``) handed to job-facing commands (``hooks``) and to local subscribers over a
Unix socket (``localsub``), all wired in ``daemon`` (parts built in ``assembly``, effects run by
``executor``, bus messages opened by ``inbox``, state files in ``statefiles``).
"""
