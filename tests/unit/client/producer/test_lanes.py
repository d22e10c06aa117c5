"""The generation rule (metaq.client.producer.lanes, docs/producer.md): a partition's batches are never stored
behind a later batch of the same producer, whatever the interleaving of replies, refusals, lost connections and
deadlines. Deterministic interleavings first, then hypothesis drives a lane against a model broker that appends
in request order per connection (and, for an idempotent lane, checks sequences as storage/producers.py does)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from metaq.client.producer.batches import ProducerBatch
from metaq.client.producer.lanes import Lane
from metaq.protocol.records import ProducerStamp
from metaq.storage.producers import ProducerStateTable

KEY = ("t", 0, 1, 1)
A, B = object(), object()
"""Two connections (a lane only compares them by identity)."""


def batch(count: int = 1) -> ProducerBatch:
    b = ProducerBatch(KEY, 0.0, 1e9)
    b.count = count
    return b


def write(lane: Lane, conn: object) -> ProducerBatch | None:
    b = lane.next_for(conn)
    if b is not None:
        lane.written(b, conn)
        if lane.checked:
            lane.stamp(b)
    return b


def test_batches_go_in_order_on_one_connection_and_a_new_one_waits_for_the_old_generation() -> None:
    lane = Lane(KEY)
    b1, b2, b3 = batch(), batch(), batch()
    for b in (b1, b2, b3):
        lane.add(b)
    assert write(lane, A) is b1 and write(lane, A) is b2
    # the master changed: the new connection may not write while b1 and b2 are unresolved on the old one
    assert lane.next_for(B) is None and not lane.can_write(B)
    assert lane.stored(b1) == []
    assert lane.next_for(B) is None
    assert lane.stored(b2) == []
    assert write(lane, B) is b3  # the old generation is resolved: a new one starts


def test_refused_batches_go_again_first_in_send_order_once_the_generation_is_resolved() -> None:
    lane = Lane(KEY)
    b1, b2, b3 = batch(), batch(), batch()
    for b in (b1, b2):
        lane.add(b)
        write(lane, A)
    lane.add(b3)  # sealed while the paused master held b1 and b2
    assert lane.failed(b1, resend=True) == []  # NOT_MASTER: certainly not stored
    assert lane.next_for(B) is None and lane.next_for(A) is None  # resolving: nothing goes
    assert lane.failed(b2, resend=True) == []
    assert lane.settle()
    assert [write(lane, B), write(lane, B), write(lane, B)] == [b1, b2, b3]


def test_a_refused_batch_fails_when_a_later_one_of_its_generation_was_stored() -> None:
    lane = Lane(KEY)
    b1, b2 = batch(), batch()
    for b in (b1, b2):
        lane.add(b)
        write(lane, A)
    assert lane.failed(b1, resend=True) == []  # NOT_ENOUGH_REPLICAS for b1 ...
    assert lane.stored(b2) == [b1]  # ... and a slave caught up in time for b2: b1 again would land behind it
    assert lane.settle() and lane.waiting == type(lane.waiting)()


def test_a_refused_batch_fails_when_a_later_one_may_have_been_stored() -> None:
    lane = Lane(KEY)
    b1, b2, b3 = batch(), batch(), batch()
    for b in (b1, b2, b3):
        lane.add(b)
        write(lane, A)
    lane.failed(b1, resend=True)
    b2.maybe_written = True  # the connection was lost with b2 in flight (retries=0: its failure is its result)
    assert lane.failed(b2, resend=False) == [b1]
    b3.maybe_written = True
    assert lane.failed(b3, resend=False) == []
    assert lane.settle() and not lane.waiting


def test_an_idempotent_lane_resends_a_refused_batch_and_what_followed_it_in_order() -> None:
    lane = Lane(KEY, checked=True, producer_id=7)
    b1, b2 = batch(2), batch(3)
    for b in (b1, b2):
        lane.add(b)
        write(lane, A)
    assert (b1.stamp, b2.stamp) == (ProducerStamp(7, 0, 0), ProducerStamp(7, 0, 2))
    assert lane.failed(b1, resend=True) == []  # NOT_MASTER
    assert lane.failed(b2, resend=True) == []  # OUT_OF_ORDER_SEQUENCE_NUMBER: the broker checks the order
    assert lane.settle()
    assert [write(lane, B), write(lane, B)] == [b1, b2]
    assert (b1.stamp, b2.stamp) == (ProducerStamp(7, 0, 0), ProducerStamp(7, 0, 2))  # the same bytes again


def test_a_new_epoch_starts_only_once_no_batch_of_the_old_one_may_be_stored_unknown() -> None:
    lane = Lane(KEY, checked=True, producer_id=7)
    b1, b2, b3 = batch(), batch(), batch()
    for b in (b1, b2):
        lane.add(b)
        write(lane, A)
    lane.add(b3)
    b1.maybe_written = True
    lane.failed(b1, resend=False)  # its deadline passed with its outcome unknown: a gap, maybe
    b2.maybe_written = True
    lane.failed(b2, resend=True)  # the connection was lost: it may be stored
    assert lane.settle()
    assert lane.broken and lane.epoch == 0  # b2 must be asked about first, with its old stamp
    assert write(lane, B) is b2 and b2.stamp == ProducerStamp(7, 0, 1)
    assert lane.next_for(B) is None  # b3 (new) waits: stamped now it would open the new epoch too early
    b2.maybe_written = False
    lane.failed(b2, resend=True)  # OUT_OF_ORDER: proven not stored (b1 was not either)
    assert lane.settle() and not lane.broken and lane.epoch == 1
    assert [write(lane, B), write(lane, B)] == [b2, b3]
    assert (b2.stamp, b3.stamp) == (ProducerStamp(7, 1, 0), ProducerStamp(7, 1, 1))


def test_a_partition_that_does_not_know_the_producer_makes_it_start_again_at_sequence_0() -> None:
    """b1 refused (NOT_ENOUGH_REPLICAS), b2 reaches a broker with no state for the producer: taken at sequence 1
    it would make b1's resend look like an old duplicate (acked, never stored). The broker refuses it
    (UNKNOWN_PRODUCER_ID) and the lane starts a new epoch: both go again, in order, from sequence 0."""
    table = ProducerStateTable()
    lane = Lane(KEY, checked=True, producer_id=7)
    b1, b2 = batch(), batch()
    for b in (b1, b2):
        lane.add(b)
        write(lane, A)
    lane.failed(b1, resend=True)
    assert b2.stamp is not None and table.check(b2.stamp, 1).kind == "unknown-producer"
    lane.failed(b2, resend=True, restart=True)
    assert lane.settle() and lane.epoch == 1
    assert [write(lane, A), write(lane, A)] == [b1, b2]
    for b in (b1, b2):
        assert b.stamp is not None and table.check(b.stamp, 1).kind == "append"
        table.record(b.stamp, 1, b.order, 0)
    assert (b1.stamp, b2.stamp) == (ProducerStamp(7, 1, 0), ProducerStamp(7, 1, 1))


def test_a_batch_past_its_deadline_leaves_the_lane_and_breaks_an_idempotent_sequence() -> None:
    lane = Lane(KEY, checked=True, producer_id=7)
    b1, b2 = batch(), batch()
    lane.add(b1)
    write(lane, A)
    lane.failed(b1, resend=True)
    lane.settle()
    lane.add(b2)
    assert lane.expire(b1) and lane.broken  # stamped, refused, never stored: its sequence is a gap
    assert lane.settle() and lane.epoch == 1
    assert write(lane, A) is b2 and b2.stamp == ProducerStamp(7, 1, 0)


# -- hypothesis: a lane against a model broker ---------------------------------------------------------------


@dataclass
class Conn:
    queue: list[ProducerBatch] = field(default_factory=list)


@dataclass
class Model:
    """One partition on a broker that appends each connection's requests in order; what the client was told."""

    checked: bool
    log: list[int] = field(default_factory=list)
    """The order of each batch copy stored, in storage order."""
    producers: ProducerStateTable = field(default_factory=ProducerStateTable)
    stored_told: set[int] = field(default_factory=set)
    failed_not_stored: set[int] = field(default_factory=set)
    offset: int = 0

    def apply(self, b: ProducerBatch) -> str:
        """What the broker does with a batch that reaches it: "stored", "duplicate" or "out-of-order"."""
        if self.checked:
            assert b.stamp is not None
            verdict = self.producers.check(b.stamp, b.count).kind
            if verdict in ("duplicate", "duplicate-unknown"):
                return "duplicate"
            if verdict in ("out-of-order", "fenced", "unknown-producer"):
                return verdict
            self.producers.record(b.stamp, b.count, self.offset, 0)
        self.offset += b.count
        self.log.append(b.order)
        return "stored"


OPS = st.sampled_from(["seal", "seal", "write", "write", "write", "reply", "reply", "reply", "refuse", "lose", "switch",
                       "switch", "expire"])


@settings(max_examples=500, deadline=None)
@given(checked=st.booleans(), ops=st.lists(OPS, max_size=60), data=st.data())
def test_no_batch_is_stored_behind_a_later_one_and_an_idempotent_lane_stores_each_once(
        checked: bool, ops: list[str], data: st.DataObject) -> None:
    lane = Lane(KEY, checked=checked, producer_id=7)
    model = Model(checked)
    conns = [Conn()]
    current = conns[0]
    done: set[int] = set()

    def settle() -> None:
        if not lane.inflight and (lane.resolving or lane.broken):
            lane.settle()

    def outcome(b: ProducerBatch, what: str, in_flight_reply: bool = True) -> None:
        if what in ("stored", "duplicate"):
            for d in lane.stored(b):
                fail_for_good(d)
            model.stored_told.add(b.order)
            done.add(b.order)
        elif what in ("out-of-order", "fenced", "unknown-producer"):
            b.maybe_written = False
            lane.failed(b, resend=True, restart=what == "unknown-producer")
        elif what == "refused":
            lane.failed(b, resend=True)
        else:  # lost with the connection: the broker may or may not have applied it
            b.maybe_written = True
            for d in lane.failed(b, resend=checked):
                fail_for_good(d)
            if not checked:
                done.add(b.order)  # retries=0: "may have been stored" is its result
        settle()

    def fail_for_good(d: ProducerBatch) -> None:
        if not d.maybe_written:
            model.failed_not_stored.add(d.order)
        done.add(d.order)

    def process(conn: Conn, refuse: bool) -> None:
        b = conn.queue.pop(0)
        outcome(b, "refused" if refuse else model.apply(b))

    for op in ops:
        if op == "seal":
            lane.add(batch(data.draw(st.integers(1, 3))))
        elif op == "write":
            b = lane.next_for(current)
            if b is not None:
                lane.written(b, current)
                if checked:
                    lane.stamp(b)
                current.queue.append(b)
        elif op in ("reply", "refuse"):
            busy = [c for c in conns if c.queue]
            if busy:  # the newest connection first as often as any other: a new master answers before a paused one
                process(busy[-1] if data.draw(st.booleans()) else data.draw(st.sampled_from(busy)), op == "refuse")
        elif op == "lose":
            for b in list(current.queue):
                if data.draw(st.booleans()):
                    model.apply(b)  # applied, its reply lost
                current.queue.remove(b)
                outcome(b, "lost")
            current = Conn()
            conns.append(current)
        elif op == "switch":  # a new master: the old connection keeps its requests (a paused master)
            current = Conn()
            conns.append(current)
        elif op == "expire":
            candidates = [*lane.resend, *lane.waiting]
            if candidates:
                b = data.draw(st.sampled_from(candidates))
                if lane.expire(b):
                    fail_for_good(b)
                    settle()
    # the faults are over: every connection answers, everything left goes, until all has a result
    for _ in range(1000):
        busy = [c for c in conns if c.queue]
        if busy:
            process(busy[0], refuse=False)
            continue
        if lane.next_for(current) is not None:
            b = lane.next_for(current)
            assert b is not None
            lane.written(b, current)
            if checked:
                lane.stamp(b)
            current.queue.append(b)
            continue
        settle()
        if not lane.waiting and not lane.inflight and not lane.resend:
            break
    assert not lane.waiting and not lane.inflight and not lane.resend
    first_copies = []
    for order in model.log:
        if order not in first_copies:
            first_copies.append(order)
    assert first_copies == sorted(first_copies), f"stored out of send order: {model.log}"
    if checked:
        assert len(model.log) == len(set(model.log)), f"stored twice: {model.log}"
    assert model.stored_told <= set(model.log)
    assert not model.failed_not_stored & set(model.log), "a batch said certainly not stored is stored"
