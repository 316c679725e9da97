"""linkguard.simulations: fault-injection scenarios, labs and runners.

Consumes: scenario files (``scenario``: a fabric, a timeline of faults, expectations; golden
files in ``scenarios/``), published failure rates (``failures``) and lab shapes. Produces, for
tests and ``linkguard sim``:

- ``engine``: a replay on a simulated clock through the real monitor, state and solver, with
  the oracle after every solve (``sim run``; ``sim fleet`` with ``failures`` and
  ``fleetreport`` for 30 days of a 2,048-host fleet);
- ``fleet`` + ``live``: the real service and one real agent per host in one process, over a
  real Mosquitto or the in-memory bus (:mod:`linkguard.membus`), replayed in real time with
  the oracle on the routes the agents installed (``sim run --bus``);
- ``lab`` + ``labprocs`` + ``labrun`` + ``labreport`` + ``udpflow``: network namespaces,
  veths and bridges that behave like hosts, leaves and spines, with real agent and service
  processes, Mosquitto and UDP flows; per-fault data-plane gaps and a kernel reachability
  oracle (``sim lab``);
- ``oracle``: what the plans (or routes) deliver vs what the model says is reachable.
"""
