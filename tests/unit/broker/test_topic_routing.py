"""The topic exchange (broker/exchanges/exchange.py TopicExchange, RabbitMQ's topic trie): ``*`` is exactly one word,
``#`` zero or more, words are split on ``.`` (the empty key has no words, ``"."`` has two empty ones), and
the trie's memo keeps keys like ``#.#.#`` linear. Every answer is compared with a plain recursive matcher
written from the AMQP rules, over hand-picked edge cases and over random bindings and keys (hypothesis)."""

from __future__ import annotations

import functools
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.exchanges.exchange import EXCHANGE, QUEUE, Binding, TopicExchange
from broker.message import Message


def words(key: str) -> tuple[str, ...]:
    return tuple(key.split(".")) if key else ()


def reference_match(pattern: str, key: str) -> bool:
    """The AMQP 0-9-1 topic rule, written the obvious (exponential without the cache) way."""

    @functools.cache
    def match(p: tuple[str, ...], k: tuple[str, ...]) -> bool:
        if not p:
            return not k
        if p[0] == "#":
            return match(p[1:], k) or (bool(k) and match(p, k[1:]))
        if not k:
            return False
        return (p[0] == "*" or p[0] == k[0]) and match(p[1:], k[1:])

    return match(words(pattern), words(key))


def route(ex: TopicExchange, key: str) -> tuple[set[str], set[str]]:
    queues: set[str] = set()
    exchanges: set[str] = set()
    ex.route(key, Message("t", key, b"", b"", b""), queues, exchanges)
    return queues, exchanges


def topic(*patterns: str) -> TopicExchange:
    """A topic exchange with one queue per pattern, the queue named after the pattern."""
    ex = TopicExchange("t")
    for p in patterns:
        ex.add_binding(Binding("t", p, QUEUE, p, {}))
    return ex


EDGE_CASES = [
    # (binding key, routing key, matches)
    ("#", "", True),
    ("#", "a", True),
    ("#", "a.b.c", True),
    ("#", ".", True),
    ("", "", True),
    ("", "a", False),
    ("*", "", False),
    ("*", "a", True),
    ("*", "a.b", False),
    ("*", ".", False),
    ("*.*", ".", True),
    ("a.*", "a.", True),
    ("a.*", "a", False),
    ("a", "a.", False),
    ("a.#", "a", True),
    ("a.#", "a.b", True),
    ("a.#", "a.b.c", True),
    ("a.#", "b.a", False),
    ("a.#", "ab", False),
    ("#.a", "a", True),
    ("#.a", "x.y.a", True),
    ("#.a", "a.x", False),
    ("a.#.b", "a.b", True),
    ("a.#.b", "a.x.b", True),
    ("a.#.b", "a.x.y.z.b", True),
    ("a.#.b", "a.b.c", False),
    ("a.*.b", "a.b", False),
    ("a.*.b", "a.x.b", True),
    ("a.*.#", "a", False),
    ("a.*.#", "a.x", True),
    ("a.*.#", "a.x.y.z", True),
    ("#.*", "", False),
    ("#.*", "a", True),
    ("#.*", "a.b.c", True),
    ("*.#.*", "a", False),
    ("*.#.*", "a.b", True),
    ("#.#", "", True),
    ("#.#", "a.b", True),
    ("a.#.#.b", "a.b", True),
    ("a.#.#.b", "a.x.y.b", True),
    ("a*", "ab", False),  # * and # are whole words only
    ("a#", "a.b", False),
    ("a#", "a#", True),
    ("stock.*.nyse", "stock.ibm.nyse", True),
    ("stock.*.nyse", "stock.ibm.lse", False),
]


@pytest.mark.parametrize(("pattern", "key", "expected"), EDGE_CASES)
def test_edge_cases_match_the_rules(pattern, key, expected):
    assert reference_match(pattern, key) is expected
    assert (pattern in route(topic(pattern), key)[0]) is expected


def test_many_bindings_route_each_matching_queue_once():
    patterns = [p for p, _, _ in EDGE_CASES]
    ex = topic(*patterns)
    for key in ["", ".", "a", "a.", "a.b", "a.x.b", "a.x.y.z.b", "stock.ibm.nyse", "x.y.a", "a#", "b.a"]:
        expected = {p for p in patterns if reference_match(p, key)}
        assert route(ex, key) == (expected, set())


def test_keys_of_many_words():
    key = ".".join(f"w{i}" for i in range(200))
    ex = topic("#", "w0.#", "#.w199", "w0.#.w100.#.w199", "*.#.w1.#", "#.w200", "w0.*", "w0." + ".".join(["*"] * 199))
    assert route(ex, key)[0] == {"#", "w0.#", "#.w199", "w0.#.w100.#.w199", "*.#.w1.#",
                                 "w0." + ".".join(["*"] * 199)}


@pytest.mark.timeout(20)
def test_many_hashes_against_a_long_key_take_linear_time():
    # Without the (node, position) memo this is exponential: 12 '#' against 300 words would never finish.
    pattern = ".".join(["#"] * 12) + ".end"
    ex = topic(pattern, ".".join(["#"] * 12))
    long_miss = ".".join(["w"] * 300)
    assert route(ex, long_miss)[0] == {".".join(["#"] * 12)}
    assert route(ex, long_miss + ".end")[0] == {pattern, ".".join(["#"] * 12)}


def test_exchange_destinations_are_kept_apart_from_queues():
    ex = TopicExchange("t")
    ex.add_binding(Binding("t", "q", QUEUE, "a.*", {}))
    ex.add_binding(Binding("t", "x2", EXCHANGE, "a.#", {}))
    assert route(ex, "a.b") == ({"q"}, {"x2"})
    assert route(ex, "a") == (set(), {"x2"})


def test_unbinding_updates_routing_and_the_route_cache():
    ex = topic("a.*", "a.#")
    assert route(ex, "a.b")[0] == {"a.*", "a.#"}  # now cached
    binding = Binding("t", "a.*", QUEUE, "a.*", {})
    assert ex.remove_binding(binding.key) is not None
    assert route(ex, "a.b")[0] == {"a.#"}
    ex.add_binding(Binding("t", "new", QUEUE, "*.b", {}))
    assert route(ex, "a.b")[0] == {"a.#", "new"}
    ex.remove_binding(Binding("t", "a.#", QUEUE, "a.#", {}).key)
    ex.remove_binding(Binding("t", "new", QUEUE, "*.b", {}).key)
    assert route(ex, "a.b")[0] == set()
    assert ex._root.children == {}  # the trie is pruned back to nothing


def test_two_bindings_of_one_queue_keep_it_routed_until_both_are_gone():
    ex = TopicExchange("t")
    first = Binding("t", "q", QUEUE, "a.#", {})
    second = Binding("t", "q", QUEUE, "a.#", {"x-note": 1})  # another binding (arguments differ), same key
    ex.add_binding(first)
    ex.add_binding(second)
    assert route(ex, "a.b")[0] == {"q"}
    ex.remove_binding(first.key)
    assert route(ex, "a.b")[0] == {"q"}
    ex.remove_binding(second.key)
    assert route(ex, "a.b")[0] == set()


_binding_word = st.sampled_from(["a", "b", "c", "", "*", "#"])
_key_word = st.sampled_from(["a", "b", "c", ""])


def _join(ws: list[str]) -> str:
    return ".".join(ws)


@settings(max_examples=300, deadline=None)
@given(patterns=st.lists(st.lists(_binding_word, max_size=6).map(_join), min_size=1, max_size=8, unique=True),
       keys=st.lists(st.lists(_key_word, max_size=12).map(_join), min_size=1, max_size=8))
def test_random_bindings_and_keys_agree_with_the_reference(patterns, keys):
    ex = topic(*patterns)
    for key in keys:
        assert route(ex, key)[0] == {p for p in patterns if reference_match(p, key)}, key


# -- cost: keys and bindings of thousands of words (issue 17) -----------------------------------------------
# The matcher steps the trie's live nodes once per word, so cost grows with words x live nodes. Before it,
# '#' nodes re-pushed every later word position: 11 s for 100 '#' against a 500-word key, 0.8 s for
# '#.a.#.b.#.c' against 2,000 words (and quadratic beyond).

@pytest.mark.timeout(20)
@pytest.mark.parametrize("key_words", [
    pytest.param(["a"] * 10_000, id="all-a"),
    pytest.param(["a", "b"] * 5_000, id="a-b"),
    pytest.param(["a", "b", "c"] * 3_333 + ["x"], id="a-b-c-x"),
    pytest.param(["a", "b", "c"] * 3_333, id="a-b-c"),
])
def test_ten_thousand_words_against_hashes_route_fast(key_words):
    patterns = ["#.a.#.b.#.c", "#.a.#.b.#.c.#", "a.#.#.#.c", "*.#.*.#.*", ".".join(["#"] * 100)]
    ex = topic(*patterns)
    key = ".".join(key_words)
    started = time.perf_counter()
    got = route(ex, key)[0]
    elapsed = time.perf_counter() - started
    assert elapsed < 1.0, f"{elapsed * 1000:.0f} ms"
    expected = {p for p in patterns if reference_match_iterative(p, key)}
    assert got == expected


@pytest.mark.timeout(20)
def test_longest_shortstr_keys_route_in_milliseconds():
    # A binding key is a short string (255 bytes): 128 hashes is the most it can hold, against a routing key
    # of 128 one-letter words that never ends the way the binding wants.
    ex = topic(".".join(["#"] * 127) + ".z", ".".join(["#"] * 128))
    key = ".".join(["w"] * 128)
    started = time.perf_counter()
    for _ in range(10):
        ex._cache.clear()
        assert route(ex, key)[0] == {".".join(["#"] * 128)}
    assert (time.perf_counter() - started) / 10 < 0.05


def reference_match_iterative(pattern: str, key: str) -> bool:
    """The topic rule as a dynamic programme over (pattern words, key words): the long keys above are too
    deep for the recursive reference."""
    p, k = words(pattern), words(key)
    # ok[j]: the pattern's first i words match the key's first j words (row i, updated in place).
    ok = [True] + [False] * len(k)
    for word in p:
        if word == "#":
            for j in range(1, len(k) + 1):
                ok[j] = ok[j] or ok[j - 1]
        else:
            for j in range(len(k), 0, -1):
                ok[j] = ok[j - 1] and (word == "*" or word == k[j - 1])
            ok[0] = False
    return ok[len(k)]


_literal_key_word = st.sampled_from(["a", "b", "", "*", "#"])


@settings(max_examples=150, deadline=None)
@given(patterns=st.lists(st.lists(_binding_word, max_size=6).map(_join), min_size=1, max_size=8, unique=True),
       keys=st.lists(st.lists(_literal_key_word, max_size=12).map(_join), min_size=1, max_size=8))
def test_star_and_hash_in_a_routing_key_are_plain_words(patterns, keys):
    # In a routing key '*' and '#' are words like any other: only a binding's '*', '#' or the same word
    # matches them. Both references agree, and so does the trie.
    ex = topic(*patterns)
    for key in keys:
        expected = {p for p in patterns if reference_match(p, key)}
        assert expected == {p for p in patterns if reference_match_iterative(p, key)}
        assert route(ex, key)[0] == expected, key
