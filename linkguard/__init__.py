"""linkguard: keeps multi-node GPU training running when one fabric link fails or flaps.

This package is the contract and the host daemon. Consumes: port observations from
:mod:`linkguard.drivers`, plans from the bus. Produces: port states/events and acks on the bus,
routes in linkguard's own routing table, the rail map file. See ``linkguard.models`` for the
message schemas and ``linkguard.topics`` for topic names.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
