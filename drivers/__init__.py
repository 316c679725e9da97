"""linkguard.drivers: the edge to the kernel and hardware.

Consumes: sysfs (``/sys/class/infiniband``), rtnetlink (pyroute2), RDMA async events (the
pyverbs reader process of :mod:`~linkguard.drivers.verbs_events`: they trigger sysfs re-reads),
test/simulation scripts.
Produces: :class:`~linkguard.drivers.base.PortObservation` batches from an async
:class:`~linkguard.drivers.base.PortSource`, and kernel routes/rules applied by
:class:`~linkguard.drivers.routes.RouteTable`. Nothing above this package touches sysfs or netlink.
"""

from linkguard.drivers.base import PortObservation, PortSource

__all__ = ["PortObservation", "PortSource"]
