"""linkguard.simulations: fault-injection scenarios, labs and runners.

Consumes: scenario files (``scenario``: a fabric, a timeline of faults, expectations; golden
files in ``scenarios/``) and lab shapes (hosts x rails x GPUs). Produces: validated, expanded
event timelines, network namespaces with veth pairs and bridges that behave like hosts, rails
and leaves (``lab``), an in-process fleet (``fleet``) and the oracle that compares what plans
deliver with what the model says is reachable (``oracle``), for tests and ``linkguard sim``.
"""
