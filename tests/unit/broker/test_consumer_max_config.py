"""``consumer_max_per_channel`` is read as RabbitMQ's schema reads it: a positive integer or ``infinity``
(the default, no limit); 0 and negative numbers are refused at start."""

from __future__ import annotations

import pytest

from broker.config import ConfigError, Settings, apply_setting


@pytest.mark.parametrize(("value", "expected"), [("10", 10), ("1", 1), ("infinity", None)])
def test_accepted_values(value, expected):
    s = Settings()
    assert s.consumer_max_per_channel is None
    apply_setting(s, "consumer_max_per_channel", value, "test")
    assert s.consumer_max_per_channel == expected


@pytest.mark.parametrize("value", ["0", "-1", "many"])
def test_refused_values(value):
    with pytest.raises(ConfigError, match="consumer_max_per_channel"):
        apply_setting(Settings(), "consumer_max_per_channel", value, "test")
