"""The Kubernetes Lease backend of the leader election (linkguard.topology.leader_k8s).

Shown:
- the pure decision (:func:`decide`) on every case client-go's leaderelection distinguishes: an
  absent Lease is created (term 1); a released one, an expired one of another (expired by the
  wall clock *and* seen unchanged for its duration) and a previous incarnation's under this
  identity are taken with ``leaseTransitions + 1``; a live one of another is not (and the wait
  is the later of the two rules, so a clock running ahead or behind cannot take it early); the
  holder's own is renewed keeping ``leaseTransitions`` (it grows only on a change of holder);
  a Lease not its own any more makes the holder step down; malformed fields are clear errors;
- MicroTime parsing and formatting as the API server writes it;
- the pod's access (:func:`in_cluster`) and ``leader.kubernetes`` settings (exclusive with
  ``leader.etcd``; namespace from the service account, name from the fabric);
- over real HTTP to a loopback stand-in of the API server (one Lease, resourceVersion checks,
  409s; there is no API server on this machine): two KubernetesLease instances, only one leads;
  when the leader cannot reach the API server it steps down at its local deadline *before* the
  standby takes over with a higher term; a write by another that takes the Lease makes the
  holder's renewal fail with 409 and it steps down, while a write that keeps its spec (an
  annotation) costs one re-read and nothing else; a clean resign releases the Lease and the
  standby takes it at its next poll, and so does a resign after a loss by the deadline; over
  https the service account's CA verifies the server and another CA is refused.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import ssl
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from linkguard.config import ConfigError, ServiceSettings
from linkguard.topology.leader import SoleLeader, leadership_from_settings
from linkguard.topology.leader_k8s import (
    Acquire,
    ClusterAccess,
    Create,
    KubernetesLease,
    LeaseFormatError,
    Lost,
    Renew,
    Wait,
    decide,
    format_micro_time,
    in_cluster,
    lease_body,
    parse_lease,
    parse_micro_time,
    release_spec,
)
from tests.support import until

T0 = datetime(2026, 12, 1, 3, 0, 0, tzinfo=UTC)


def lease(
    holder: str | None = "other",
    *,
    renew: datetime | None = T0,
    duration: int | None = 15,
    transitions: int | None = 3,
    rv: str = "100",
    **spec_extra: Any,
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if holder is not None:
        spec["holderIdentity"] = holder
    if duration is not None:
        spec["leaseDurationSeconds"] = duration
    if renew is not None:
        spec["renewTime"] = format_micro_time(renew)
        spec["acquireTime"] = format_micro_time(renew - timedelta(minutes=5))
    if transitions is not None:
        spec["leaseTransitions"] = transitions
    spec.update(spec_extra)
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "l", "namespace": "ns", "resourceVersion": rv},
        "spec": spec,
    }


def campaign(read: dict[str, Any] | None, *, now: datetime, seen: float = 0.0, me: str = "me"):
    return decide(read, identity=me, term=None, now=now, seen_for_s=seen, ttl_s=10)


# -- the pure decision -------------------------------------------------------------------------


def test_absent_lease_is_created_with_term_1() -> None:
    a = campaign(None, now=T0)
    assert isinstance(a, Create) and a.term == 1
    assert a.spec == {
        "holderIdentity": "me",
        "leaseDurationSeconds": 10,
        "acquireTime": "2026-12-01T03:00:00.000000Z",
        "renewTime": "2026-12-01T03:00:00.000000Z",
        "leaseTransitions": 1,
    }


def test_live_lease_of_another_is_not_taken() -> None:
    a = campaign(lease(), now=T0 + timedelta(seconds=5), seen=5)
    assert a == Wait(10.0, holder="other")
    # one microsecond before renewTime + duration, even after a long observation
    a = campaign(lease(), now=T0 + timedelta(seconds=15) - timedelta(microseconds=1), seen=60)
    assert isinstance(a, Wait) and a.delay_s == pytest.approx(1e-6)


def test_expired_lease_of_another_is_taken_with_transitions_plus_1() -> None:
    now = T0 + timedelta(seconds=15)
    a = campaign(lease(transitions=3), now=now, seen=15)
    assert isinstance(a, Acquire)
    assert (a.term, a.resource_version) == (4, "100")
    assert a.spec["leaseTransitions"] == 4 and a.spec["holderIdentity"] == "me"
    assert a.spec["acquireTime"] == a.spec["renewTime"] == format_micro_time(now)
    assert a.spec["leaseDurationSeconds"] == 10  # mine, not the previous holder's 15


def test_clock_skew_can_only_delay_a_takeover() -> None:
    """Wall clock ahead (renewTime looks old) but the record was seen for less than its
    duration: wait for the observation rule (client-go's, independent of clocks). Wall clock
    behind (renewTime looks recent or in the future) but seen long enough: wait for the wall
    rule. Taken only when both agree."""
    ahead = T0 + timedelta(hours=1)
    assert campaign(lease(), now=ahead, seen=4) == Wait(11.0, holder="other")
    behind = T0 - timedelta(seconds=30)
    a = campaign(lease(), now=behind, seen=100)
    assert isinstance(a, Wait) and a.delay_s == pytest.approx(45.0)
    assert isinstance(campaign(lease(), now=ahead, seen=15), Acquire)


def test_released_lease_is_taken_at_once() -> None:
    for released in (lease(holder=""), lease(holder=None, renew=None, duration=None)):
        a = campaign(released, now=T0, seen=0)
        assert isinstance(a, Acquire) and a.term == 4
    # a fresh Lease written by client-go (no transitions yet): term 1, not 0
    a = campaign(lease(holder="", transitions=None), now=T0)
    assert isinstance(a, Acquire) and a.term == 1


def test_my_identity_from_a_previous_incarnation_is_a_new_term() -> None:
    """A restarted process with the same identity (e.g. a pod name) never resumes the old
    term: the dead one's plans must be fenced off from the new one's."""
    a = campaign(lease(holder="me"), now=T0 + timedelta(seconds=1))
    assert isinstance(a, Acquire) and a.term == 4


def test_my_own_lease_is_renewed_and_transitions_do_not_move() -> None:
    held = lease(holder="me", transitions=4, rv="200")
    now = T0 + timedelta(seconds=3)
    a = decide(held, identity="me", term=4, now=now, seen_for_s=0, ttl_s=10)
    assert isinstance(a, Renew)
    assert (a.term, a.resource_version) == (4, "200")  # the PUT is checked against rv 200
    assert a.spec["leaseTransitions"] == 4
    assert a.spec["renewTime"] == format_micro_time(now)
    assert a.spec["acquireTime"] == held["spec"]["acquireTime"]  # kept on renewal


def test_transitions_grow_only_on_a_change_of_holder() -> None:
    """A sequence of holders through the pure function: each take is +1, renewals keep it."""
    now, obj, terms = T0, None, []
    for who in ("a", "a", "b", "b", "b", "a", "c"):
        current = parse_lease(obj).holder if obj else None
        if who == current:
            act = decide(obj, identity=who, term=terms[-1], now=now, seen_for_s=0, ttl_s=2)
            assert isinstance(act, Renew)
        else:
            now += timedelta(seconds=10)  # the previous holder's Lease expired
            act = campaign(obj, now=now, seen=10, me=who)
            assert isinstance(act, Create | Acquire)
        obj = lease_body(obj, act.spec, namespace="ns", name="l")
        obj["metadata"]["resourceVersion"] = str(len(terms) + 1)
        terms.append(act.term)
    assert terms == [1, 1, 2, 2, 2, 3, 4]


def test_leader_steps_down_when_the_lease_is_not_its_own() -> None:
    def lead(read: dict[str, Any] | None):
        return decide(read, identity="me", term=4, now=T0, seen_for_s=0, ttl_s=10)

    assert lead(None) == Lost("the Lease was deleted")
    assert lead(lease(holder="other", transitions=5)) == Lost("the Lease is held by other now")
    assert lead(lease(holder="")) == Lost("the Lease is held by nobody (released) now")
    lost = lead(lease(holder="me", transitions=6))  # taken and given back in between
    assert isinstance(lost, Lost) and "leaseTransitions is 6" in lost.why


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        ([], "expected an object"),
        ({"kind": "ConfigMap", "metadata": {"resourceVersion": "1"}}, "kind"),
        ({"kind": "Lease", "spec": {}}, "metadata"),
        ({"kind": "Lease", "metadata": {}}, "resourceVersion"),
        (lease(transitions=-1), "leaseTransitions"),
        (lease(transitions="4"), "leaseTransitions"),
        (lease(transitions=True), "leaseTransitions"),
        (lease(duration=0), "leaseDurationSeconds"),
        (lease(duration=2**31), "leaseDurationSeconds"),
        (lease(holder=7), "holderIdentity"),
        (lease(renewTime="yesterday"), "renewTime"),
        (lease(renewTime="2026-12-01T03:00:00"), "renewTime"),  # no offset
        (lease(renewTime="2026-13-01T03:00:00Z"), "renewTime"),
        (lease(acquireTime=1764558000), "acquireTime"),
        ({**lease(), "spec": "x"}, "spec"),
    ],
)
def test_malformed_lease_is_a_clear_error(obj: Any, field: str) -> None:
    with pytest.raises(LeaseFormatError, match=field):
        campaign(obj, now=T0, seen=100)


def test_a_held_lease_without_duration_or_renew_time_is_not_taken() -> None:
    for bad in (lease(duration=None), lease(renew=None)):
        with pytest.raises(LeaseFormatError, match="not taken"):
            campaign(bad, now=T0 + timedelta(days=1), seen=1e6)


def test_micro_time() -> None:
    assert parse_micro_time("2026-12-01T03:38:21.123456Z") == datetime(
        2026, 12, 1, 3, 38, 21, 123456, tzinfo=UTC
    )
    assert parse_micro_time("2026-12-01T03:38:21Z") == datetime(2026, 12, 1, 3, 38, 21, tzinfo=UTC)
    # a numeric offset and nanoseconds (digits beyond microseconds dropped)
    assert parse_micro_time("2026-12-01T05:38:21.123456789+02:00") == datetime(
        2026, 12, 1, 3, 38, 21, 123456, tzinfo=UTC
    )
    t = datetime(2026, 12, 1, 3, 38, 21, 5, tzinfo=UTC)
    assert format_micro_time(t) == "2026-12-01T03:38:21.000005Z"
    assert parse_micro_time(format_micro_time(t)) == t
    with pytest.raises(ValueError):
        format_micro_time(datetime(2026, 1, 1))  # naive
    with pytest.raises(ValueError):
        decide(None, identity="me", term=None, now=datetime(2026, 1, 1), seen_for_s=0, ttl_s=2)


def test_release_keeps_transitions_and_body_keeps_metadata() -> None:
    held = lease(holder="me", transitions=4, rv="7")
    held["metadata"]["annotations"] = {"a": "b"}
    spec = release_spec(held, T0)
    assert spec["holderIdentity"] == "" and spec["leaseTransitions"] == 4
    assert spec["leaseDurationSeconds"] == 1
    body = lease_body(held, spec, namespace="ns", name="l")
    assert body["metadata"] == {
        "name": "l",
        "namespace": "ns",
        "resourceVersion": "7",
        "annotations": {"a": "b"},
    }
    assert held["spec"]["holderIdentity"] == "me"  # the read object is not modified
    # and the next candidate takes the released Lease at once with term 5
    released = {**body, "metadata": {**body["metadata"], "resourceVersion": "8"}}
    a = campaign(released, now=T0, seen=0)
    assert isinstance(a, Acquire) and a.term == 5


# -- the pod's access and the settings ---------------------------------------------------------


def service_account(tmp: Path, namespace: str | None = "linkguard") -> Path:
    root = tmp / "serviceaccount"
    root.mkdir()
    (root / "token").write_text("tok\n")
    (root / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    if namespace is not None:
        (root / "namespace").write_text(namespace)
    return root


def test_in_cluster(tmp_path: Path) -> None:
    root = service_account(tmp_path)
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    got = in_cluster(env, root)
    assert got == ClusterAccess(
        "https://10.96.0.1:443", root / "ca.crt", root / "token", "linkguard"
    )
    v6 = in_cluster({**env, "KUBERNETES_SERVICE_HOST": "fd00::1"}, root)
    assert v6.base_url == "https://[fd00::1]:443"
    with pytest.raises(ConfigError, match="KUBERNETES_SERVICE_HOST"):
        in_cluster({}, root)
    with pytest.raises(ConfigError, match="not a port"):
        in_cluster({**env, "KUBERNETES_SERVICE_PORT": "https"}, root)
    (root / "token").unlink()
    with pytest.raises(ConfigError, match="automountServiceAccountToken"):
        in_cluster(env, root)


def test_kubernetes_settings(tmp_path: Path) -> None:
    s = ServiceSettings(leader={"kubernetes": {}})
    assert s.leader.kubernetes is not None and s.leader.kubernetes.ttl_s == 15
    with pytest.raises(ValueError, match="choose one"):
        ServiceSettings(leader={"kubernetes": {}, "etcd": {"endpoints": ["e:2379"]}})
    for bad in ({"ttl_s": 1}, {"namespace": "Bad_NS"}, {"name": "-x"}, {"nope": 1}):
        with pytest.raises(ValueError):
            ServiceSettings(leader={"kubernetes": bad})
    root = service_account(tmp_path)
    access = in_cluster({"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "6443"}, root)
    k = KubernetesLease.from_settings(
        s.leader.kubernetes, fabric="rail-a", identity="pod-1/abc", access=access
    )
    assert (k.namespace, k.name, k.ttl_s, k.identity) == (
        "linkguard",
        "linkguard-rail-a-leader",
        15,
        "pod-1/abc",
    )
    assert k.describe() == {
        "role": "standby",
        "term": None,
        "backend": "kubernetes",
        "key": "linkguard/linkguard-rail-a-leader",
    }
    explicit = ServiceSettings(leader={"kubernetes": {"namespace": "ops", "name": "lg"}})
    k = KubernetesLease.from_settings(
        explicit.leader.kubernetes, fabric="Rail_A", identity="x", access=access
    )
    assert (k.namespace, k.name) == ("ops", "lg")
    with pytest.raises(ConfigError, match=r"set leader\.kubernetes\.name"):
        KubernetesLease.from_settings(
            s.leader.kubernetes, fabric="Rail_A", identity="x", access=access
        )
    (tmp_path / "b").mkdir()
    no_ns = in_cluster(
        {"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "1"},
        service_account(tmp_path / "b", namespace=None),
    )
    with pytest.raises(ConfigError, match="namespace"):
        KubernetesLease.from_settings(s.leader.kubernetes, fabric="f", identity="x", access=no_ns)
    # outside a pod the service refuses to start with a clear error (not a crash)
    if not Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists():
        with pytest.raises(ConfigError, match=r"leader\.kubernetes"):
            leadership_from_settings(s.leader, fabric="f", identity="x")
    assert isinstance(
        leadership_from_settings(ServiceSettings().leader, fabric="f", identity="x"), SoleLeader
    )


# -- over HTTP, against a stand-in API server --------------------------------------------------


class FakeLeaseServer:
    """A stand-in for the Kubernetes API server (there is none on this machine), on loopback
    over plain HTTP: the ``coordination.k8s.io/v1`` Lease endpoints for any name in any
    namespace -- GET (404 when absent), POST (409 AlreadyExists when present), PUT (404 when
    absent, 409 Conflict unless ``metadata.resourceVersion`` is the stored one) -- with a
    fresh integer resourceVersion on every write, bearer tokens checked (401), and tokens that
    can be ``cut`` (503, as an API server behind a partition) to make a leader stop renewing.
    It checks what a real API server checks for this (optimistic concurrency), not the
    schema."""

    def __init__(self, tokens: set[str], tls: ssl.SSLContext | None = None) -> None:
        self.tokens = tokens
        self.cut: set[str] = set()
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.rv = 0
        self.writes: list[tuple[str, str, int]] = []  # (method, holder, leaseTransitions)
        self.conflicts = 0
        self.refused = 0  # 401s
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                return None

            def _reply(self, code: int, obj: dict[str, Any]) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str) -> None:
                self._reply(
                    code, {"kind": "Status", "status": "Failure", "reason": reason, "code": code}
                )

            def _handle(self, method: str) -> None:
                token = self.headers.get("Authorization", "").removeprefix("Bearer ")
                if token not in server.tokens:
                    server.refused += 1
                    return self._status(401, "Unauthorized")
                if token in server.cut:
                    return self._status(503, "ServiceUnavailable")
                parts = self.path.strip("/").split("/")
                # apis coordination.k8s.io v1 namespaces <ns> leases [<name>]
                if parts[:3] != ["apis", "coordination.k8s.io", "v1"] or parts[3] != "namespaces":
                    return self._status(404, "NotFound")
                ns = parts[4]
                body = None
                if method in ("POST", "PUT"):
                    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    if method == "POST":
                        key = (ns, body["metadata"]["name"])
                        if key in server.leases:
                            return self._status(409, "AlreadyExists")
                        return self._reply(201, server._store(key, body, "POST"))
                    key = (ns, parts[6])
                    have = server.leases.get(key)
                    if have is None:
                        return self._status(404, "NotFound")
                    if method == "GET":
                        return self._reply(200, have)
                    if (
                        body["metadata"].get("resourceVersion")
                        != have["metadata"]["resourceVersion"]
                    ):
                        server.conflicts += 1
                        return self._status(409, "Conflict")
                    return self._reply(200, server._store(key, body, "PUT"))

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_PUT(self) -> None:
                self._handle("PUT")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:  # https, as the real API server (a handshake per connection)
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def _store(self, key: tuple[str, str], body: dict[str, Any], method: str) -> dict[str, Any]:
        self.rv += 1
        body = json.loads(json.dumps(body))
        body["metadata"]["resourceVersion"] = str(self.rv)
        body["metadata"]["namespace"] = key[0]
        self.leases[key] = body
        spec = body.get("spec", {})
        self.writes.append((method, spec.get("holderIdentity"), spec.get("leaseTransitions")))
        return body

    def write_as_another(self, key: tuple[str, str], **spec: Any) -> None:
        """What another client's write does: a new resourceVersion."""
        with self.lock:
            obj = json.loads(json.dumps(self.leases[key]))
            obj["spec"].update(spec)
            self._store(key, obj, "PUT")

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[FakeLeaseServer, dict[str, ClusterAccess]]]:
    server = FakeLeaseServer({"tok-a", "tok-b"})
    access = {}
    for who in ("a", "b"):
        token = tmp_path / f"token-{who}"
        token.write_text(f"tok-{who}\n")
        access[who] = ClusterAccess(f"http://127.0.0.1:{server.port}", None, token, "linkguard")
    try:
        yield server, access
    finally:
        server.close()


def instance(access: ClusterAccess, who: str, ttl_s: int = 2) -> KubernetesLease:
    return KubernetesLease(
        access=access, namespace="linkguard", name="lg-leader", identity=who, ttl_s=ttl_s
    )


KEY = ("linkguard", "lg-leader")


async def test_one_leads_the_other_takes_over_after_it_stops_renewing(api) -> None:
    server, access = api
    a, b = instance(access["a"], "a"), instance(access["b"], "b")
    ta = asyncio.create_task(a.campaign())
    tb = asyncio.create_task(b.campaign())
    try:
        done, _ = await asyncio.wait({ta, tb}, return_when=asyncio.FIRST_COMPLETED, timeout=10)
        assert len(done) == 1, "exactly one wins the race for an absent Lease"
        leader, standby = (a, b) if ta in done else (b, a)
        assert leader.term == 1 and leader.is_leader() and not standby.is_leader()
        assert server.leases[KEY]["spec"]["holderIdentity"] == leader.identity
        # it keeps renewing while the other waits: several renewals, the standby still out
        renewals = len(server.writes)
        await until(lambda: len(server.writes) >= renewals + 3, "three renewals", timeout=5)
        assert leader.is_leader() and not standby.is_leader() and not leader.lost.is_set()
        assert {h for _, h, _ in server.writes} == {leader.identity}

        # the leader can no longer reach the API server: it stops renewing
        server.cut.add(f"tok-{leader.identity}")
        cut_at = time.monotonic()
        await until(leader.lost.is_set, "the leader stepping down", timeout=5)
        assert "local deadline" in (leader.why_lost or "")
        assert not leader.is_leader()
        new_term = await asyncio.wait_for(ta if standby is a else tb, 10)
        lost_at, won_at = leader.lost_at, standby.elected_at
        assert lost_at is not None and won_at is not None
        assert new_term == 2 and standby.is_leader()
        assert lost_at < won_at, "the old leader stopped before the new one started"
        # stepped down within ttl - ttl/4 of its last good renewal: at most 1.5 s after the cut
        assert lost_at - cut_at <= 1.5 + 0.1
        # the standby waited a lease duration after it saw the last renewal, which was sent at
        # most ttl/3 before the cut
        assert won_at - cut_at >= 2 - 2 / 3
        spec = server.leases[KEY]["spec"]
        assert (spec["holderIdentity"], spec["leaseTransitions"]) == (standby.identity, 2)
        print(f"step-down {lost_at - cut_at:.2f} s, takeover {won_at - cut_at:.2f} s after the cut")
    finally:
        for t in (ta, tb):
            t.cancel()
        await a.resign()
        await b.resign()


async def test_a_conflicting_write_makes_the_holder_step_down(api) -> None:
    server, access = api
    a, b = instance(access["a"], "a"), instance(access["b"], "b")
    try:
        assert await asyncio.wait_for(a.campaign(), 5) == 1
        tb = asyncio.create_task(b.campaign())
        # another client writes the Lease (holder changed, transitions + 1, as a rival would)
        server.write_as_another(KEY, holderIdentity="rival", leaseTransitions=2)
        await until(a.lost.is_set, "the holder's renewal failing with 409", timeout=5)
        assert a.why_lost == "409 Conflict on renewal: the Lease is held by rival now"
        assert server.conflicts >= 1 and not a.is_leader()
        # the rival's Lease is live and keeps being renewed: b does not take it
        for _ in range(3):
            await asyncio.sleep(0.5)  # the rival renews on its own schedule
            server.write_as_another(KEY, renewTime=format_micro_time(datetime.now(UTC)))
            assert not tb.done()
        # the rival dies: b takes over with a higher term than the rival's
        assert await asyncio.wait_for(tb, 10) == 3
        assert b.is_leader() and not a.is_leader()
    finally:
        await a.resign()
        await b.resign()


async def test_a_write_that_keeps_the_holder_is_not_a_loss(api) -> None:
    """Another client annotates the Lease (new resourceVersion, same spec): the holder's next
    renewal gets 409, reads the Lease, finds it still its own and renews against the fresh
    resourceVersion; it keeps leading with the same term."""
    server, access = api
    a = instance(access["a"], "a")
    try:
        assert await asyncio.wait_for(a.campaign(), 5) == 1
        with server.lock:
            server.leases[KEY]["metadata"]["annotations"] = {"note": "kubectl annotate"}
        server.write_as_another(KEY)
        rv = server.leases[KEY]["metadata"]["resourceVersion"]
        await until(lambda: server.conflicts >= 1, "the renewal's 409")
        await until(
            lambda: server.leases[KEY]["metadata"]["resourceVersion"] != rv, "the next renewal"
        )
        assert a.is_leader() and not a.lost.is_set() and a.term == 1
        got = server.leases[KEY]
        assert got["spec"]["holderIdentity"] == "a" and got["spec"]["leaseTransitions"] == 1
        assert got["metadata"]["annotations"] == {"note": "kubectl annotate"}  # kept
    finally:
        await a.resign()


async def test_resign_releases_and_the_standby_takes_it_at_its_next_poll(api) -> None:
    server, access = api
    a, b = instance(access["a"], "a", ttl_s=8), instance(access["b"], "b", ttl_s=8)
    try:
        assert await asyncio.wait_for(a.campaign(), 5) == 1
        tb = asyncio.create_task(b.campaign())
        await until(lambda: b._seen is not None, "the standby reading the live Lease")
        assert not tb.done()
        t = time.monotonic()
        await a.resign()
        assert server.leases[KEY]["spec"]["holderIdentity"] == ""
        assert server.leases[KEY]["spec"]["leaseTransitions"] == 1
        assert await asyncio.wait_for(tb, 5) == 2
        assert time.monotonic() - t < 8 / 4 + 0.5, "at the next poll, not after the TTL"
        assert a.lost.is_set() and not a.is_leader() and b.is_leader()
        assert [w[0] for w in server.writes].count("POST") == 1
    finally:
        await a.resign()
        await b.resign()


async def test_wrong_token_is_retried_and_never_leads(api) -> None:
    server, access = api
    server.tokens.discard("tok-b")
    b = instance(access["b"], "b")
    try:
        t = asyncio.create_task(b.campaign())
        await until(lambda: server.refused >= 3, "three refused reads")
        assert not t.done() and b.term is None and not server.leases
        t.cancel()
    finally:
        await b.resign()


def make_ca_and_server_cert(tmp: Path, name: str) -> tuple[Path, Path, Path]:
    """A CA and a certificate it signs for 127.0.0.1 (as the API server's is for its service
    IP): (ca.crt, server.crt, server.key), PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def cert(subject: str, key, issuer: str, signer, *, ca: bool, ip: bool) -> x509.Certificate:
        now = datetime.now(UTC)
        b = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=1))
            .not_valid_after(now + timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if ip:
            san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
            b = b.add_extension(san, critical=False)
        return b.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = cert(f"{name}-ca", ca_key, f"{name}-ca", ca_key, ca=True, ip=False)
    srv = cert("kube-apiserver", key, f"{name}-ca", ca_key, ca=False, ip=True)
    paths = tmp / f"{name}-ca.crt", tmp / f"{name}-server.crt", tmp / f"{name}-server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(srv.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


async def test_https_with_the_service_account_ca_and_not_with_another(tmp_path: Path) -> None:
    """The in-cluster path: https, the CA file verifies the server (ssl context from
    ``ca.crt``), the token from its file. A CA that did not sign the server's certificate:
    every request fails verification, the instance never leads."""
    ca, crt, key = make_ca_and_server_cert(tmp_path, "cluster")
    other_ca, _, _ = make_ca_and_server_cert(tmp_path, "other")
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(crt, key)
    server = FakeLeaseServer({"tok"}, tls=tls)
    token = tmp_path / "token"
    token.write_text("tok")
    url = f"https://127.0.0.1:{server.port}"
    good = instance(ClusterAccess(url, ca, token, "linkguard"), "good")
    bad = instance(ClusterAccess(url, other_ca, token, "linkguard"), "bad")
    try:
        assert await asyncio.wait_for(good.campaign(), 5) == 1
        assert server.leases[KEY]["spec"]["holderIdentity"] == "good"
        await good.resign()
        assert server.leases[KEY]["spec"]["holderIdentity"] == ""  # released: bad could take it
        import httpx

        for _ in range(2):  # what every poll of its campaign meets
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await bad._try_once()
        assert bad.term is None and server.leases[KEY]["spec"]["holderIdentity"] == ""
    finally:
        await good.resign()
        await bad.resign()
        server.close()


async def test_a_holder_that_lost_by_its_deadline_still_releases_its_own_record(api) -> None:
    """Cut off until its local deadline passed, then back: its resign clears its own record
    (nobody took it yet), so the standby need not wait out the TTL; a record another wrote
    since would have been left alone (the release is checked against its own last write)."""
    server, access = api
    a, b = instance(access["a"], "a", ttl_s=8), instance(access["b"], "b", ttl_s=8)
    try:
        assert await asyncio.wait_for(a.campaign(), 5) == 1
        server.cut.add("tok-a")
        await until(a.lost.is_set, "the deadline passing", timeout=10)
        server.cut.discard("tok-a")
        await a.resign()
        assert server.leases[KEY]["spec"]["holderIdentity"] == ""
        t = time.monotonic()
        assert await asyncio.wait_for(b.campaign(), 5) == 2
        assert time.monotonic() - t < 1.0  # released: taken on the first read, no TTL wait
    finally:
        await a.resign()
        await b.resign()
