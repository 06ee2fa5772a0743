"""Deterministic shuffling, exact resume, multiple epochs and host sharding."""

import json

import numpy as np
import pytest

from jaxrl_llm.data import epoch_order, make_iterator
from jaxrl_llm.errors import ConfigError

DATA = list(range(23))


def take(it, n):
    return [list(next(it)) for _ in range(n)]


def test_epoch_order_deterministic_and_epoch_dependent():
    a = epoch_order(50, seed=3, epoch=0)
    np.testing.assert_array_equal(a, epoch_order(50, seed=3, epoch=0))
    assert sorted(a) == list(range(50))
    assert not np.array_equal(a, epoch_order(50, seed=3, epoch=1))
    assert not np.array_equal(a, epoch_order(50, seed=4, epoch=0))
    np.testing.assert_array_equal(epoch_order(5, seed=3, epoch=2, shuffle=False), range(5))


def test_same_seed_same_batches_and_epochs_cover_data():
    it1 = make_iterator(DATA, batch_size=5, seed=7, num_epochs=2)
    it2 = make_iterator(DATA, batch_size=5, seed=7, num_epochs=2)
    b1, b2 = list(it1), list(it2)
    assert b1 == b2 and len(b1) == 2 * (23 // 5)
    e0, e1 = sum(b1[:4], []), sum(b1[4:], [])
    assert len(set(e0)) == 20 and len(set(e1)) == 20  # no repeats within an epoch
    assert e0 != e1  # different order per epoch


def test_resume_mid_epoch_yields_exactly_the_remaining_batches():
    collate = lambda xs: [x * 10 for x in xs]
    full = list(make_iterator(DATA, batch_size=4, seed=1, num_epochs=3, collate_fn=collate))
    for stop in (0, 3, 5, 6, 11):  # mid-epoch, epoch boundary (5 steps/epoch), later epochs
        it = make_iterator(DATA, batch_size=4, seed=1, num_epochs=3, collate_fn=collate)
        head = take(it, stop)
        state = json.loads(json.dumps(it.state()))  # survives a JSON round trip
        rest = list(
            make_iterator(DATA, batch_size=4, seed=1, num_epochs=3, collate_fn=collate, state=state)
        )
        assert head + rest == full


def test_resume_rejects_mismatched_state():
    it = make_iterator(DATA, batch_size=4, seed=1)
    next(it)
    with pytest.raises(ConfigError, match="saved for 23 examples"):
        make_iterator(DATA[:-1], batch_size=4, seed=1, state=it.state())
    with pytest.raises(ConfigError, match="seed"):
        make_iterator(DATA, batch_size=4, seed=2, state=it.state())


def test_host_sharding_partitions_each_global_batch():
    hosts = [
        make_iterator(DATA, batch_size=3, seed=5, num_epochs=2, process_index=h, process_count=3)
        for h in range(3)
    ]
    single = list(make_iterator(DATA, batch_size=9, seed=5, num_epochs=2))
    per_host = [list(it) for it in hosts]
    assert all(len(p) == len(single) == 4 for p in per_host)  # 23 // 9 = 2 steps x 2 epochs
    for step, global_batch in enumerate(single):
        parts = [per_host[h][step] for h in range(3)]
        assert sum(parts, []) == global_batch  # disjoint slices that tile the global batch
        assert len(set(sum(parts, []))) == 9


def test_bad_arguments():
    with pytest.raises(ConfigError, match="process_index"):
        make_iterator(DATA, batch_size=2, process_index=2, process_count=2)
    with pytest.raises(ConfigError, match="cannot fill one global batch"):
        make_iterator(DATA, batch_size=12, process_count=2)
