"""The adjusted Rand index against scikit-learn's, its independent reference."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import adjusted_rand_score

from cfl_mpi.clustering.labels import adjusted_rand_index

pairs_of_labelings = st.integers(1, 60).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(0, 6), min_size=n, max_size=n), st.lists(st.integers(-3, 40), min_size=n, max_size=n)
    )
)


@settings(max_examples=300, deadline=None)
@given(pairs_of_labelings)
def test_equals_scikit_learns_adjusted_rand_score(labelings):
    truth, labels = (np.array(x) for x in labelings)
    assert np.isclose(adjusted_rand_index(truth, labels), adjusted_rand_score(truth, labels), rtol=1e-12, atol=1e-15)


def test_the_cases_the_runs_meet():
    four = np.repeat(np.arange(4), 600)  # 2,400 silos in four rotations
    assert adjusted_rand_index(four, four[::-1] + 7) == 1.0
    assert adjusted_rand_index(four, np.zeros_like(four)) == adjusted_rand_score(four, np.zeros_like(four)) == 0.0
    assert adjusted_rand_index(np.arange(5), np.arange(5)) == 1.0  # every silo alone in both
    assert adjusted_rand_index([0], [3]) == 1.0
