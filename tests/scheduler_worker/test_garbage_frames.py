"""No frame a peer can send kills the scheduler or makes it generate (see tests/garbage.py)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from common.messages import (
    AbortRequest,
    GenerateRequest,
    StepOutputs,
    encode,
    pack_ids,
    unpack_ids,
)
from common.sampling_params import SamplingParams
from common.zmq_queue import PullQueue
from tests.garbage import (
    RawPush,
    collect,
    errors_for,
    make_config,
    malformed,
    misrouted,
    running,
    sockets,
)

pytestmark = pytest.mark.timeout(60)


def test_scheduler_worker_survives_garbage(run_dir, tiny_llama_dir):
    from scheduler_worker.engine import LLMEngine
    from scheduler_worker.worker import SchedulerWorker

    config = make_config(run_dir, tiny_llama_dir)
    ipc = config.ipc
    engine = LLMEngine(config.engine, tiny_llama_dir)
    frontend = PullQueue(ipc.endpoint("frontend"), bind=True)
    detok = PullQueue(ipc.endpoint("detok"), bind=True)
    worker = SchedulerWorker(config, engine)
    push = RawPush(ipc.endpoint("scheduler"), bind=False)
    now = time.time()
    greedy = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)

    def gr(rid, ids=None, params=None):
        ids = pack_ids([1, 2, 3, 4, 5]) if ids is None else ids
        return GenerateRequest(rid, ids, greedy if params is None else params, now)

    bad = [
        gr("bad-ids-bytes", ids=b"\x01\x02\x03"),
        gr("bad-ids-empty", ids=b""),
        gr("bad-ids-negative", ids=b"\xff\xff\xff\xff"),
        gr("bad-ids-vocab", ids=pack_ids([1, engine.vocab_size])),
        # well-typed (mistyped ones are malformed frames: tests.garbage.bad_params)
        gr("bad-temperature", params=SamplingParams(temperature=-1)),
        gr("bad-context", params=SamplingParams(max_tokens=10**6)),
        gr("bad-stop", params=SamplingParams(stop=[""])),
        gr("bad-logprobs", params=SamplingParams(logprobs=99)),
        gr("bad-min-tokens", params=SamplingParams(max_tokens=2, min_tokens=3)),
        gr("bad-bias", params=SamplingParams(logit_bias={engine.vocab_size: 1.0})),
    ]
    frames = malformed(gr("sample"))
    with sockets(frontend, detok, push), running(worker) as thread:
        push.send_all(frames)
        push.send_all(misrouted(GenerateRequest, AbortRequest))
        push.send_all(encode(m) for m in bad)
        # forged aborts: unknown rids, a rid that failed above, and one whose request
        # arrives after its abort (it must never run)
        for rid in ("ghost", "bad-temperature", "late", "", "x" * 10_000):
            push.send(encode(AbortRequest(rid, "forged")))
        push.send(encode(gr("late")))
        push.send(encode(gr("good")))

        def good_done(ms):
            return any(
                isinstance(m, StepOutputs)
                and "good" in m.rids
                and m.finish_reasons[m.rids.index("good")] is not None
                for m in ms
            )

        steps = collect(detok, good_done, thread)
        assert thread.is_alive()
        assert all(isinstance(m, StepOutputs) for m in steps)
        tokens, reasons = [], []
        for m in steps:
            assert set(m.rids) == {"good"}, m.rids  # nothing bad, aborted or forged ran
            tokens += unpack_ids(m.new_token_ids[0])
            reasons.append(m.finish_reasons[0])
        assert len(tokens) == 3 and reasons[-1] == "length"
        assert ("good", [], True, False) in [tuple(r) for r in steps[0].new_requests]
        want = {m.rid for m in bad}
        errs = errors_for(collect(frontend, lambda ms: set(errors_for(ms)) >= want, thread))
        assert set(errs) == want and all(e.status == 400 for e in errs.values()), errs
        assert worker.inbox.num_dropped == len(frames)
        assert "ghost" in worker.pre_aborted
        assert "late" not in worker.pre_aborted  # consumed when "late" arrived
    assert not engine.has_unfinished()
    engine.block_manager.check_integrity()
    assert engine.generate([[1, 2, 3, 4, 5]], greedy) == [tokens]  # same as offline


def test_scheduler_refuses_a_kv_pool_smaller_than_the_context(run_dir, tiny_llama_dir):
    """Tokenizers accept requests up to the context length; a pool that cannot hold one
    would fail some of them later, so the scheduler refuses to start, saying what to set."""
    from common.config import ConfigError
    from scheduler_worker.engine import LLMEngine
    from scheduler_worker.worker import check_kv_pool

    config = make_config(run_dir, tiny_llama_dir)
    small = replace(config.engine, cache=replace(config.engine.cache, num_blocks=127))
    with pytest.raises(ConfigError, match=r"508 tokens .* context length \(512 tokens\)"):
        check_kv_pool(LLMEngine(small, tiny_llama_dir))
    check_kv_pool(LLMEngine(config.engine, tiny_llama_dir))  # 128 blocks of 4: fits
