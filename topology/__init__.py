"""linkguard.topology: the topology service.

Consumes: a fabric (file or generator), every host's inventory, port states, events and acks
from the bus, switch-level faults from operators. Produces: epoch-numbered per-host plans and
shared peer routes (rail and route assignments with precomputed backups), signed when a key is
configured; a change feed (:mod:`linkguard.topology.changes`) that the ledger
(:mod:`linkguard.ledger`), the metrics and the HTTP API with its dashboard
(:mod:`linkguard.topology.api`, ``dashboard/``) consume. The solver
(:mod:`linkguard.topology.solver`, with :mod:`.hostbase`, :mod:`.planmodels` and
:mod:`.planlookup`) is pure: states in, plans out. So is the service's core
(:mod:`.core`: messages and ticks with ``now`` in, :mod:`.effects` out; with :mod:`.integrity`,
:mod:`.probedesk` and :mod:`.schedule`); :mod:`.service` wires it all and, with
:mod:`.serviceio` and :mod:`.faultsio`, executes the effects.
"""
