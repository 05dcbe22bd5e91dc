"""dispatch.digests: digests remembered per array object (the graph cache hands them to the
arrays it loads, so a restarting process hashes no weights) and the identity memo behind it,
which the graph cache uses for its fingerprints too."""

from __future__ import annotations

import numpy as np

from dispatch.digests import IdentityMemo, array_digest, known_digest, remember


def test_a_value_is_given_back_only_for_the_object_it_was_remembered_for():
    memo = IdentityMemo()
    a, b = np.zeros(3), np.zeros(3)
    memo.put(a, "A")
    assert memo.get(a) == "A" and memo.get(b) is None


def test_a_dead_objects_value_is_never_given_to_a_new_object_at_its_address():
    memo = IdentityMemo(prune_above=0)
    seen = set()
    for _ in range(200):  # new arrays often reuse a freed one's id
        arr = np.zeros(4)
        seen.add(id(arr))
        assert memo.get(arr) is None
        memo.put(arr, "old")
        del arr  # freed by its reference count at once (no gc.collect: in the full suite's
        # heap, 200 collections took 166 s of a CI run)
    assert len(seen) < 200, "no id was reused: the check above proved nothing"


def test_objects_without_weak_references_are_not_remembered():
    memo = IdentityMemo()
    memo.put(7, "seven")  # ints take no weak reference
    assert memo.get(7) is None


def test_array_digest_is_remembered_and_a_given_digest_is_trusted():
    arr = np.arange(10, dtype=np.float32)
    assert known_digest(arr) is None
    digest = array_digest(arr)
    assert known_digest(arr) == digest == array_digest(arr.copy())
    other = np.ones(2)
    remember(other, "from the graph cache")
    assert array_digest(other) == "from the graph cache"
