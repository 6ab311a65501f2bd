"""A page of a sorted listing (broker/management/listing.py ``_page_of``): the heap the first pages of a long
list come from gives exactly the rows a full stable sort gives, forward and reverse, ties and all."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.management.listing import _page_of

rows_strategy = st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["a", "b", "c", "op-1", "op-10", "op-2"])),
                         max_size=300)


@settings(max_examples=300, deadline=None)
@given(rows=rows_strategy, reverse=st.booleans(), page=st.integers(1, 5), size=st.integers(1, 40))
def test_a_page_is_the_slice_of_the_stable_sort(rows, reverse, page, size):
    objects = [(k, name, i) for i, (k, name) in enumerate(rows)]  # the index tells equal rows apart
    expected = sorted(objects, key=lambda o: (o[0], o[1]), reverse=reverse)[(page - 1) * size: page * size]
    got = _page_of(list(objects), lambda o: o[0], lambda o: o[1], reverse, (page - 1) * size, page * size)
    assert got == expected


def test_the_first_page_of_many_comes_from_the_heap_and_is_right():
    objects = [(i % 7, f"q{i % 100}", i) for i in range(10_000)]
    for reverse in (False, True):
        expected = sorted(objects, key=lambda o: (o[0], o[1]), reverse=reverse)[100:200]
        assert _page_of(list(objects), lambda o: o[0], lambda o: o[1], reverse, 100, 200) == expected
