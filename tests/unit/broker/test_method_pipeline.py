"""A channel's method pipeline (broker/amqp/method_pipeline.py): frames that come while a reply is deferred wait,
in order, and are handed back once it is sent, a turn's share at a time, pausing again when one defers; a long
backlog pauses the socket; a closed channel drops its backlog. (The reader and a real cluster drive it in
tests/integration/cluster/test_cluster_deferred_replies.py.)"""

from __future__ import annotations

import asyncio
from typing import Any

from broker.amqp.method_pipeline import DRAIN_PER_TURN, HOLD_MAX, MethodPipeline


class Flow:
    def __init__(self) -> None:
        self.reasons: set[object] = set()
        self.pauses = 0

    def pause_for(self, reason: object) -> None:
        self.reasons.add(reason)
        self.pauses += 1

    def resume_for(self, reason: object) -> None:
        self.reasons.discard(reason)


class Channel:
    """Handles a frame as the reader would: records it, and defers its reply for payloads starting "defer"."""

    def __init__(self) -> None:
        self.handled: list[Any] = []
        self.flow = Flow()
        self.closed = False
        self.mid_content = False
        self.pipeline = MethodPipeline(self.dispatch, self.flow, lambda: self.mid_content, lambda: self.closed)

    def dispatch(self, frame_type: int, payload: Any) -> None:
        self.handled.append(payload)
        if str(payload).startswith("defer"):
            self.pipeline.pause()
        if payload == "close":
            self.closed = True

    def frame(self, payload: Any) -> None:
        """What the reader does with a live frame."""
        if self.pipeline.backlog is not None:
            self.pipeline.add(1, payload)
        else:
            self.dispatch(1, payload)


async def turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_frames_wait_behind_a_deferred_reply_and_keep_their_order() -> None:
    ch = Channel()
    ch.frame("a")
    ch.frame("defer-1")
    ch.frame("b")
    ch.frame("c")
    await turns()
    assert ch.handled == ["a", "defer-1"]  # b and c wait, however many turns pass
    ch.pipeline.resume()  # the reply is sent
    assert ch.handled == ["a", "defer-1"]  # not within the callback that sent it
    ch.frame("d")  # came before the drain's turn: behind c
    await turns()
    assert ch.handled == ["a", "defer-1", "b", "c", "d"]
    assert ch.pipeline.backlog is None  # running again
    ch.frame("e")
    assert ch.handled[-1] == "e"  # handled at once


async def test_a_drained_frame_that_defers_pauses_the_rest_again() -> None:
    ch = Channel()
    ch.frame("defer-1")
    for p in ("b", "defer-2", "c", "d"):
        ch.frame(p)
    ch.pipeline.resume()
    await turns()
    assert ch.handled == ["defer-1", "b", "defer-2"]
    assert [p for _, p in ch.pipeline.frames()] == ["c", "d"]
    ch.pipeline.resume()
    await turns()
    assert ch.handled == ["defer-1", "b", "defer-2", "c", "d"]


async def test_a_retry_that_defers_again_before_the_drain_turn_holds_everything() -> None:
    """A method handled again (the channel's _handle_again) resumes, then defers again in the same callback."""
    ch = Channel()
    ch.frame("defer-1")
    ch.frame("b")
    ch.pipeline.resume()
    ch.pipeline.pause()
    await turns()
    assert ch.handled == ["defer-1"]
    ch.pipeline.resume()
    await turns()
    assert ch.handled == ["defer-1", "b"]


async def test_a_turn_hands_back_a_share_but_never_ends_inside_a_publish() -> None:
    ch = Channel()
    ch.frame("defer")
    n = DRAIN_PER_TURN * 2 + 10
    for i in range(n):
        ch.frame(i)
    ch.pipeline.resume()
    await asyncio.sleep(0)
    assert len(ch.handled) == 1 + DRAIN_PER_TURN
    ch.mid_content = True  # a publish's content is being received: the turn goes on past its share
    await asyncio.sleep(0)
    assert len(ch.handled) == 1 + n
    assert ch.handled[1:] == list(range(n))


async def test_a_long_backlog_pauses_the_socket_until_half_of_it_is_handled() -> None:
    ch = Channel()
    ch.frame("defer")
    for i in range(HOLD_MAX):
        ch.frame(i)
    assert not ch.flow.reasons
    ch.frame("one more")
    assert ch.flow.reasons == {ch.pipeline} and ch.flow.pauses == 1
    ch.pipeline.resume()
    while len(ch.handled) < HOLD_MAX // 2:
        assert ch.flow.reasons  # still paused until half is handled
        await asyncio.sleep(0)
    await turns(HOLD_MAX // DRAIN_PER_TURN + 2)
    assert not ch.flow.reasons
    assert len(ch.handled) == HOLD_MAX + 2


async def test_a_closed_channel_drops_its_backlog_and_gives_the_socket_back() -> None:
    ch = Channel()
    ch.frame("defer")
    for i in range(HOLD_MAX + 1):
        ch.frame(i)
    assert ch.flow.reasons
    ch.closed = True
    ch.pipeline.clear()
    assert not ch.flow.reasons and ch.pipeline.backlog is None and not ch.pipeline.paused
    ch.pipeline.resume()
    await turns()
    assert ch.handled == ["defer"]


async def test_a_frame_that_closes_the_channel_ends_the_drain() -> None:
    ch = Channel()
    ch.frame("defer")
    for p in ("b", "close", "c"):
        ch.frame(p)
    ch.pipeline.resume()
    await turns()
    assert ch.handled == ["defer", "b", "close"]
