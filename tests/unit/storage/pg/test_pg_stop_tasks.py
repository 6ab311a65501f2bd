"""storage/pg/connections.py ``stop_tasks``: a task whose cancel ``asyncio.wait_for`` swallowed (Python 3.11:
the cancel arrives as the awaited future completes) still stops; the queue statistics writer of a member that
stopped kept flushing that way, and its close waited for ever."""

from __future__ import annotations

import asyncio

from storage.pg.connections import stop_tasks


def test_a_task_whose_cancels_wait_for_swallowed_is_stopped() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        swallows = 3

        async def looper() -> None:
            nonlocal swallows
            while True:
                if not swallows:
                    await asyncio.sleep(0.001)  # (a loop's other awaits: a cancel there ends the task)
                    continue
                swallows -= 1
                fut = loop.create_future()
                # The cancel arrives in the same turn as the future's result: wait_for returns the result.
                fut.add_done_callback(lambda _f: task.cancel())
                loop.call_soon(fut.set_result, None)
                await asyncio.wait_for(fut, 1)

        task = loop.create_task(looper())
        await asyncio.sleep(0.02)
        assert swallows == 0 and not task.done(), "the cancels were not swallowed: the test shows nothing"
        assert await stop_tasks(task, timeout=2) == set()
        assert task.cancelled()

    asyncio.run(main())


def test_a_task_that_will_not_end_is_returned_after_the_timeout() -> None:
    async def main() -> None:
        give_up = asyncio.Event()

        async def stubborn() -> None:
            while not give_up.is_set():
                try:
                    await asyncio.sleep(0.01)
                except asyncio.CancelledError:
                    pass

        task = asyncio.get_running_loop().create_task(stubborn())
        await asyncio.sleep(0)
        assert await stop_tasks(task, None, timeout=0.2) == {task}
        give_up.set()
        await task

    asyncio.run(main())
