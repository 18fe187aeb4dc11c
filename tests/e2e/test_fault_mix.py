"""Faults and bad input under load (issue 52), on the CPU: chat streams at once, a third
disconnecting mid-stream, a tenth with an invalid sampling value, some with 20 top
logprobs a token (benchmarks/gpu/client_faults.py, which the GPU check runs at 256
streams): every other stream whole, every invalid one a 400 naming its parameter, the
disconnected ones aborted, and once idle no KV block, batch slot or request left behind."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))
import client_faults  # noqa: E402

pytestmark = pytest.mark.timeout(300)

STREAMS, TOKENS = 30, 16


def test_faults_leave_the_other_streams_whole_and_nothing_behind(server):
    aborted = 'zeroserve:request_success_total{finished_reason="abort"}'
    before = server.metrics().get(aborted, 0.0)
    res = client_faults.fault_mix(server.url, STREAMS, TOKENS)
    assert res["problems"] == []
    kinds = [client_faults.kind(i) for i in range(STREAMS)]
    assert res["kinds"] == {k: kinds.count(k) for k in set(kinds)}
    assert min(res["kinds"].values()) >= 2  # every kind is in the mix
    assert res["faults"]["streams"] == kinds.count("plain") + kinds.count("logprobs")
    assert res["after"]["idle"], res["after"]
    assert res["verdict"] == "PASS"
    # each disconnecting stream left after 2-6 of its 16 tokens: the server aborted it
    assert server.metrics()[aborted] - before >= kinds.count("disconnect")
