"""scheduler_worker.backends.int_columns: a list of ints as the int64 array np.array makes
of it, whatever its length, values and element types; refused where numpy refuses."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest

from scheduler_worker.backends.int_columns import int64_array


def test_lists_of_every_length_come_out_as_numpys():
    rng = random.Random(0)
    for n in [0, 1, 2, 7, 256, 1000, 256, 1]:  # lengths seen again reuse their packer
        for lo, hi in [(-1, 300), (-(2**63), 2**63 - 1)]:
            values = [rng.randint(lo, hi) for _ in range(n)]
            got = int64_array(values)
            assert got.dtype == np.int64 and got.shape == (n,)
            np.testing.assert_array_equal(got, np.array(values, dtype=np.int64))


def test_the_array_is_its_own_and_writable():
    values = [3, 1, 2]
    a, b = int64_array(values), int64_array(values)
    a[0] = 9
    np.maximum(a, 2, out=a)
    assert a.tolist() == [9, 2, 2] and b.tolist() == [3, 1, 2] and values == [3, 1, 2]


def test_numpy_ints_and_bools_count_as_ints():
    assert int64_array([np.int64(5), np.int32(-2), True]).tolist() == [5, -2, 1]
    assert int64_array(range(4)).tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("bad", [[2**63], [-(2**63) - 1], [1.5], ["1"], [None]])
def test_what_is_no_int64_is_refused(bad):
    with pytest.raises(struct.error):
        int64_array(bad)
