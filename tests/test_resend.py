"""The numbering that lets a kernel's messages survive a reconnect (remote_magic/wire/resend.py): what was
lost in flight is sent again, in order, and nothing is delivered twice."""

from __future__ import annotations

from remote_magic.wire.resend import ACK_EVERY_S, RESEND_AFTER_S, Inbound, Outbound


def test_a_message_lost_in_flight_comes_again_in_order_and_nothing_is_delivered_twice() -> None:
    sender: Outbound[str] = Outbound()
    receiver = Inbound()
    delivered: list[str] = []
    wire = []
    for text in ("a", "b", "c", "d"):
        seq = sender.number()
        sender.keep(seq, text)
        wire.append((seq, text))
    del wire[1]  # "b" was in the TCP connection that broke
    delivered += [text for seq, text in wire if receiver.accept(seq)]
    assert delivered == ["a"]  # after the gap, "c" and "d" wait for "b"
    ack = receiver.ack_due(now=100.0)
    assert ack == 1
    sender.acked(ack)
    assert sender.due(now=0.0) == [] and [t for _, t in sender.unacked] == ["b", "c", "d"]
    again = sender.due(now=1e9)  # no acknowledgement for longer than RESEND_AFTER_S
    assert again == ["b", "c", "d"]
    delivered += [text for seq, text in zip((2, 3, 4), again) if receiver.accept(seq)]
    assert delivered == ["a", "b", "c", "d"]
    sender.acked(receiver.ack_due(now=100.0 + 2 * ACK_EVERY_S) or 0)
    assert not sender.unacked and sender.due(now=2e9) == []


def test_a_lost_acknowledgement_is_repeated_when_the_messages_come_again() -> None:
    sender: Outbound[str] = Outbound()
    receiver = Inbound()
    seq = sender.number()
    sender.keep(seq, "x")
    assert receiver.accept(seq) and receiver.ack_due(now=10.0) == 1  # this ack is lost
    assert sender.due(now=1e9) == ["x"]
    assert not receiver.accept(seq)  # a repeat: not delivered again ...
    assert receiver.ack_due(now=10.0 + 2 * ACK_EVERY_S) == 1  # ... but acknowledged again
    sender.acked(1)
    assert sender.due(now=2e9) == [] and RESEND_AFTER_S > ACK_EVERY_S
    assert receiver.accept(None)  # an unnumbered message (an older peer's) is always delivered
