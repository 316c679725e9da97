"""linkguard.topology: the topology service.

Consumes: a fabric (file or generator), every host's inventory and port states from the bus.
Produces: epoch-numbered per-host plans (rail and route assignments with precomputed backups).
The solver (:mod:`linkguard.topology.solver`) is pure: states in, plans out.
"""
