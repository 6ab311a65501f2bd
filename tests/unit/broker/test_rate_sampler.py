"""broker/management/presenters/rates.py's RateSampler: a queue, connection or channel is kept as one tuple of
its counters; a rate is the change per second between the last two samples, absent (0.0) once an object
stopped moving, and forgotten with the object."""

from __future__ import annotations

from broker.management.presenters.connections import CHANNEL_SAMPLED, CONNECTION_SAMPLED
from broker.management.presenters.rates import RateSampler


def test_a_moving_object_has_rates_and_an_idle_one_has_none() -> None:
    sampler = RateSampler()
    sampler.sample_object(1, CONNECTION_SAMPLED, (100, 1, 50, 1), 10.0)
    assert sampler.rate((1, "recv_oct")) == 0.0  # one sample: no rate yet
    sampler.sample_object(1, CONNECTION_SAMPLED, (600, 3, 50, 1), 15.0)
    assert (sampler.rate((1, "recv_oct")), sampler.rate((1, "recv_cnt")), sampler.rate((1, "send_oct"))) == \
        (100.0, 0.4, 0.0)
    sampler.sample_object(1, CONNECTION_SAMPLED, (600, 3, 50, 1), 20.0)
    assert sampler.rate((1, "recv_oct")) == 0.0
    assert sampler._rates == {}  # an idle object keeps no rate entries


def test_another_kind_of_object_under_a_reused_id_starts_afresh() -> None:
    sampler = RateSampler()
    sampler.sample_object(7, CONNECTION_SAMPLED, (0, 0, 0, 0), 0.0)
    sampler.sample_object(7, CONNECTION_SAMPLED, (500, 5, 500, 5), 5.0)
    assert sampler.rate((7, "recv_oct")) == 100.0
    values = tuple(range(len(CHANNEL_SAMPLED)))
    sampler.sample_object(7, CHANNEL_SAMPLED, values, 10.0)  # the connection is gone, a channel has its id
    assert sampler._rates == {}
    sampler.sample_object(7, CHANNEL_SAMPLED, tuple(v + 10 for v in values), 15.0)
    assert sampler.rate((7, "publish")) == 2.0 and sampler.rate((7, "recv_oct")) == 0.0


def test_forgetting_drops_an_objects_sample_and_rates() -> None:
    sampler = RateSampler()
    for now, n in ((0.0, 0), (5.0, 50)):
        sampler.sample_object(1, CONNECTION_SAMPLED, (n, n, n, n), now)
        sampler.sample_object(2, CONNECTION_SAMPLED, (n, n, n, n), now)
    assert sampler.rate((1, "send_cnt")) == sampler.rate((2, "send_cnt")) == 10.0
    sampler.forget_all_but({2})
    assert sampler.rate((1, "send_cnt")) == 0.0 and sampler.rate((2, "send_cnt")) == 10.0
    assert set(sampler._object_prev) == {2}
