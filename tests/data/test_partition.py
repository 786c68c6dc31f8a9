from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cfl_mpi.config import Config
from cfl_mpi.data import RotatedData
from cfl_mpi.data.partition import holdout_split, images_shared_by, shard, sized_shard, true_clusters


def test_true_clusters_are_rotation_major():
    np.testing.assert_array_equal(true_clusters(8, 4), [0, 0, 1, 1, 2, 2, 3, 3])


def test_group_silos_hold_disjoint_slices_of_one_copy():
    shards = [shard(s, 8, 4, 1000, 200, 0.1, seed=0) for s in range(8)]
    for g in range(4):
        a, b = shards[2 * g], shards[2 * g + 1]
        own_a = np.concatenate([a.train, a.val])
        own_b = np.concatenate([b.train, b.val])
        assert not set(own_a) & set(own_b) and not set(a.test) & set(b.test)
        assert len(own_a) + len(own_b) == 1000 and len(a.test) + len(b.test) == 200
        assert abs(len(a.val) - 0.1 * len(own_a)) <= 1 and not set(a.train) & set(a.val)


def test_holdout_is_a_partition():
    train, test = holdout_split(100, 0.2, seed=1)
    assert len(test) == 20 and sorted(np.concatenate([train, test]).tolist()) == list(range(100))


def test_rotated_digits_rotation_and_sizes():
    cfg = Config(silos=4, data=RotatedData(rotations=[0.0, 180.0]))
    a, b = cfg.data.build(0, cfg.data_facts()), cfg.data.build(2, cfg.data_facts())  # same local index, other rotation
    assert (a.group, b.group) == (0, 1)
    assert a.x_train.shape[1:] == (1, 28, 28) and a.x_train.dtype == np.float32
    # Every rotation gets its own copy of the pool, split the same way: equal shard sizes.
    assert len(a.y_train) == len(b.y_train) and len(a.y_test) == len(b.y_test)


@settings(max_examples=60, deadline=None)
@given(
    silo_images=st.integers(2, 60), per_group=st.integers(1, 40), n_pool=st.integers(60, 400), seed=st.integers(0, 3)
)
def test_sized_shards_hold_their_size_and_share_as_little_as_the_pool_allows(silo_images, per_group, n_pool, seed):
    shards = [sized_shard(1, local, silo_images, n_pool, n_pool // 4, 0.3, seed) for local in range(per_group)]
    held = Counter()
    for s in shards:
        own = np.concatenate([s.train, s.val])
        assert len(own) == silo_images and len(set(own)) == silo_images  # no image twice in a silo
        assert len(s.val) == max(1, round(0.3 * silo_images)) and len(s.test) >= 1
        assert own.min() >= 0 and own.max() < n_pool and s.test.max() < n_pool // 4
        held.update(own.tolist())
    most = max(held.values())
    assert most <= images_shared_by(per_group, silo_images, n_pool)
    if per_group * silo_images <= n_pool:  # the group fits in the pool: disjoint silos
        assert most == 1 == images_shared_by(per_group, silo_images, n_pool)


def test_ifca_shape_on_digits_shares_images_only_beyond_the_pool():
    small = Config(silos=40, data=RotatedData(silo_images=100))  # 10 silos of 100 per rotation < 1,438
    big = Config(silos=80, data=RotatedData(silo_images=100))  # 20 x 100 > 1,438: 2 shuffles
    assert (
        small.data.silo_images_shared_by(small.data_facts()) == 1
        and big.data.silo_images_shared_by(big.data_facts()) == 2
    )
    a, b = small.data.build(0, small.data_facts()), small.data.build(1, small.data_facts())
    assert len(a.y_train) + len(a.y_val) == 100 == len(b.y_train) + len(b.y_val)
    assert not np.array_equal(a.x_train[:5], b.x_train[:5])
