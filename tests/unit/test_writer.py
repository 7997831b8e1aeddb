"""MutationWriter: one thread, in order, exceptions carried back, lower CPU priority."""

from __future__ import annotations

import os
import threading

import pytest

from lvm.writer import MutationWriter, lower_thread_priority


def test_runs_on_one_thread_in_submission_order():
    writer = MutationWriter()
    seen: list[tuple[int, int]] = []
    callers = [
        threading.Thread(target=lambda i=i: writer.run(lambda: seen.append((i, threading.get_ident()))))
        for i in range(20)
    ]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    writer.close()
    assert sorted(i for i, _ in seen) == list(range(20))
    assert len({ident for _, ident in seen}) == 1
    assert threading.get_ident() not in {ident for _, ident in seen}


def test_returns_results_and_raises_the_callers_exception():
    writer = MutationWriter()
    assert writer.run(lambda a, b=0: a + b, 2, b=3) == 5
    with pytest.raises(KeyError, match="missing"):
        writer.run(lambda: {}["missing"])
    assert writer.run(lambda: "still serving") == "still serving"
    writer.close()


def test_the_writer_thread_runs_at_a_higher_nice_value_than_its_callers():
    def nice_of_this_thread() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    writer = MutationWriter(nice_increment=5)
    mine = nice_of_this_thread()
    assert writer.run(nice_of_this_thread) == min(19, mine + 5)
    assert nice_of_this_thread() == mine  # only the writer thread was changed
    writer.close()


def test_lower_thread_priority_caps_at_19():
    result = []

    def worker():
        lower_thread_priority(100)
        result.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert result == [19]
