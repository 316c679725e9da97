"""Convergence re-sends in one batch (:meth:`linkguard.topology.convergence.Convergence.tick`),
pure: hosts due at the same tick share one publish of each peer routes message (every agent
subscribes to ``peers/+``, so one publish per host due reached every agent once per host due:
the re-send pile-up of the 64-agent chaos run)."""

from __future__ import annotations

from linkguard import topics
from linkguard.topology.effects import PublishPlans
from tests.topology.test_convergence import H, _ack, _port_down, _resent_topics, _setup


def test_hosts_due_together_share_one_publish_of_each_peer_routes_message() -> None:
    st, conv, _ = _setup()
    for h in H:
        _ack(st, conv, h, st.acked_epoch(h))
    _port_down(st, H[3])
    solved = st.solve(now=20.0)
    conv.sent([topics.peer_routes(p.host) for p in solved.peers] + [topics.plan(H[3])], 20.0)
    _ack(st, conv, H[3], st.acked_epoch(H[3]))
    # H[0], H[1], H[2] (compact plans) owe the new peer routes' epoch and never ack it
    effects, _ = conv.tick(25.0)
    assert len([e for e in effects if isinstance(e, PublishPlans)]) == 1
    assert _resent_topics(effects) == [
        topics.peer_routes(H[3]),
        topics.plan(H[0]),
        topics.plan(H[1]),
        topics.plan(H[2]),
    ]
    assert conv.resends == 3
