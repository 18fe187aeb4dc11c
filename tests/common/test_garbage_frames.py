"""The garbage the worker tests send really is garbage (see tests/garbage.py)."""

from __future__ import annotations

import pytest

from tests.garbage import (
    malformed,
    samples,
)

pytestmark = pytest.mark.timeout(60)


def test_malformed_frames_really_are_malformed():
    """The fixture itself: every frame of `malformed` fails to decode."""
    from common.messages import WireError, decode

    for sample in samples().values():
        for frame in malformed(sample):
            if isinstance(frame, list):
                continue  # multipart: rejected by the queue, not the codec
            with pytest.raises(WireError):
                decode(frame)
