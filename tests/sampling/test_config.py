"""Tests of jaxrl_llm/sampling/config.py: SamplingConfig validation and length buckets."""

import dataclasses

import pytest

from jaxrl_llm.errors import ConfigError, JaxrlError
from jaxrl_llm.sampling import SamplingConfig, bucket_length


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_p=-0.1), "top_p"),
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_k=2.5), "top_k"),
        (dict(min_p=1.0), "min_p"),
        (dict(min_p=-0.2), "min_p"),
        (dict(stop_token_ids=(3, -1)), "stop_token_ids"),
    ],
)
def test_invalid_values_raise_config_error_naming_the_field(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment) as e:
        SamplingConfig(**kwargs)
    assert isinstance(e.value, JaxrlError)
    assert "\n" not in str(e.value)


def test_greedy_allows_zero_temperature_and_records_logprobs_at_tau_one():
    s = SamplingConfig(greedy=True, temperature=0.0)
    assert s.logprob_temperature == 1.0
    assert SamplingConfig(temperature=0.7).logprob_temperature == 0.7


def test_config_is_frozen_hashable_and_replace_does_not_mutate():
    s = SamplingConfig(temperature=0.5, stop_token_ids=[4, 5])
    assert s.stop_token_ids == (4, 5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.temperature = 1.0
    t = dataclasses.replace(s, top_k=3)
    assert s.top_k == 0 and t.top_k == 3
    assert hash(s) != hash(t) or s != t
    assert {s: 1}[SamplingConfig(temperature=0.5, stop_token_ids=(4, 5))] == 1


@pytest.mark.parametrize(
    "n, expected",
    [
        (1, 16),
        (16, 16),
        (17, 32),
        (64, 64),
        (65, 128),
        (1000, 1024),
        (1025, 2048),
        (3000, 3072),
    ],
)
def test_bucket_length_default_buckets(n, expected):
    assert bucket_length(n) == expected


def test_bucket_length_custom_and_invalid():
    assert bucket_length(5, (4, 8)) == 8
    assert bucket_length(9, (4, 8)) == 16
    with pytest.raises(ConfigError, match="length"):
        bucket_length(0)
