"""linkguard.simulations: fault-injection labs and runners.

Consumes: a lab shape (hosts x rails x GPUs). Produces: network namespaces, veth pairs and
bridges that behave like hosts, rails and leaves, for tests and ``linkguard sim``.
"""
