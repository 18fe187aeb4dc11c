"""When speculation pays: the step's measured costs against each row's acceptance.

A step of N decode rows takes T0(N) without drafts. Drafting D tokens in it costs
c1(N) once (the verify path instead of the one-token decode) plus c2(N) a draft
token; a row's i-th draft is accepted with probability alpha**i (alpha: the row's recent
acceptance, a geometric run). A draft token pays when its expected tokens exceed its
share of the step's time at the step's rate, alpha**i >= c2 * N / T0 (the threshold, per
row, sets k); the step drafts at all only when its expected extra tokens beat c1 + c2 * D
at that rate. T0, c1 and c2 are a least-squares fit per batch-size bucket (powers of two)
of the steps' wall times, decayed so that the fit follows the load, each time measured in
the bucket's recent plain step (a running mean), so that costs probed under one load are
not read against a plain step of another (a busier host: drafts looked cheap, docs/
benchmarks.md, "every workload"), and a step the host stalled counts as at most STALL x
its expected time (one stalled step switched a bucket on or off for tens of steps: the
section "Speculation policy, seventh session"); until a bucket has
seen steps with and without drafts it learns (drafting, one step in four without), and
then one step in its probe interval drafts and one drafts nothing, so that its costs stay
measured whatever the policy chose. A step that drafts to learn or to probe drafts at most
PROBE_TOKENS tokens in all (alternately half as many, so that c1 and c2 part), since where
drafts do not pay a probe of every row's k drafts costs several steps' time at 32 rows.
The interval doubles, up to PROBE_MAX, each time a probe leaves the bucket switched off,
and is PROBE_EVERY again once a row drafts where the fit allows it.

    policy "always": every proposed draft, no fit (the A/B baseline and the tests').
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from scheduler_worker.request import Request
from scheduler_worker.scheduled_batch import ScheduledBatch

if TYPE_CHECKING:
    from scheduler_worker.step_output import EngineCounters

DECAY = 0.98  # a step's weight in the fit halves in ~35 steps of its bucket
MIN_STEPS = 4  # steps with and without drafts before the fit decides
PROBE_EVERY = 32  # a bucket probes one step in this many (drafting, and not)...
PROBE_MAX = 512  # ...and, while its probes find drafts do not pay, up to this many
PROBE_TOKENS = 8  # the draft tokens of a step that learns or probes, at most
PLAIN_WEIGHT = 0.125  # a plain step's weight in the bucket's running mean (its unit)
STALL = 1.5  # a step's time counts as at most this x its expected time (_Fit.add)
NO_CAP = 1 << 30
# drafts must pay by this much on the fit's figures: alpha is an estimate, and where the
# gain is marginal (8 rows on a CPU, where the GEMMs are bound by arithmetic) drafting
# anyway lost (docs/benchmarks.md, "small and backing-off probes")
MARGIN = 1.1
PRIOR = (1.0, 1.0)  # a row's acceptance prior: one accepted draft, one refused
ROW_DECAY = 0.9  # a row's acceptance counts decay per verify (and per step it sits out)


def bucket(num_rows: int) -> int:
    return max(num_rows - 1, 0).bit_length()


class _Fit:
    """Weighted least squares of t = a + b * [d > 0] + c * d, decayed per sample; t in
    units of `plain`, the recent plain step's seconds."""

    def __init__(self) -> None:
        self.plain = 0.0  # 0: no plain step yet
        self.xx = [[0.0] * 3 for _ in range(3)]
        self.xy = [0.0] * 3
        self.with_drafts = 0  # samples seen, undecayed (readiness, not weight)
        self.without = 0
        self.steps = 0  # steps started in this bucket (the probe's clock)
        self.probe_every = PROBE_EVERY
        self.probes = 0
        self.probed = False  # the last drafting step was a probe: its verdict is pending

    def add(self, drafts: int, seconds: float) -> None:
        # a step the host stalled counts as at most STALL x what it should have taken (the
        # unit, or the fit's figure for its drafts): one stalled plain step read in full
        # lowered every draft's relative cost, one stalled probe raised it, for ~35 steps
        p = self.plain
        if not drafts:  # and moves the unit by (STALL - 1) / 8 at most
            seconds = min(seconds, STALL * p) if p else seconds
            self.plain = p + PLAIN_WEIGHT * (seconds - p) if p else seconds
        elif p and self.ready():
            t0, c1, c2 = self.solve()
            if t0 > 0.0:
                seconds = min(seconds, STALL * (t0 + c1 + c2 * drafts))
        if not self.plain:
            return  # no unit yet
        t = seconds / self.plain
        x = (1.0, 1.0 if drafts else 0.0, float(drafts))
        for i in range(3):
            self.xy[i] = self.xy[i] * DECAY + x[i] * t
            for j in range(3):
                self.xx[i][j] = self.xx[i][j] * DECAY + x[i] * x[j]
        self.with_drafts += 1 if drafts else 0
        self.without += 0 if drafts else 1

    def ready(self) -> bool:
        return self.with_drafts >= MIN_STEPS and self.without >= MIN_STEPS

    def solve(self) -> tuple[float, float, float]:
        """(T0, c1, c2) in seconds at the current plain step; a tiny ridge keeps it
        solvable when the draft counts never vary (then c1 and c2 share the cost, c2 by
        the mean count)."""
        a = [row[:] + [y] for row, y in zip(self.xx, self.xy)]
        for i in (1, 2):
            a[i][i] += 1e-6 * (a[0][0] or 1.0)
        for col in range(3):  # Gauss-Jordan, 3x3
            piv = max(range(col, 3), key=lambda r: abs(a[r][col]))
            a[col], a[piv] = a[piv], a[col]
            if abs(a[col][col]) < 1e-30:
                return 0.0, 0.0, 0.0
            for r in range(3):
                if r != col:
                    f = a[r][col] / a[col][col]
                    a[r] = [v - f * w for v, w in zip(a[r], a[col])]
        t0, c1, c2 = (self.plain * a[i][3] / a[i][i] for i in range(3))
        return t0, max(c1, 0.0), max(c2, 0.0)


class SpecPolicy:
    """The per-step and per-row drafting decisions (Scheduler.schedule / _draft) and what
    they learn from (LLMEngine.step: record; LLMEngine._verified: verified)."""

    def __init__(self, mode: str = "adaptive") -> None:
        self.adaptive = mode == "adaptive"
        self.fits: dict[int, _Fit] = {}
        self.threshold = 0.0  # this step's: a draft token's acceptance must reach it
        self.costs: tuple[float, float, float] | None = None  # this step's (T0, c1, c2)
        self.cap = NO_CAP  # this step's draft tokens in all, at most (Scheduler.schedule)
        self.num_switched_off = 0  # steps whose drafts did not pay (a counter, /metrics)
        # this step probes a bucket whose fit has switched drafts off: a draft model drafts
        # only for rows whose draft sequence is live (spec.propose)
        self.probing = False
        self._decided: _Fit | None = None  # this step's bucket, where the fit decided

    # ---- deciding ----------------------------------------------------------
    def start_step(self, num_rows: int) -> bool:
        """Before a step's decode rows draft (num_rows: about how many): may they?"""
        self.threshold, self.costs, self.cap, self._decided = 0.0, None, NO_CAP, None
        self.probing = False
        if not self.adaptive or num_rows <= 0:
            return True
        fit = self.fits.setdefault(bucket(num_rows), _Fit())
        fit.steps += 1
        if not fit.ready():  # learning: a step without drafts one in four (the first: the
            if fit.without < MIN_STEPS and fit.steps % 4 == 1:  # fit's unit) until seen
                return False
            return self._probe(fit)
        phase = fit.steps % fit.probe_every
        if phase == fit.probe_every // 2:  # a step without drafts keeps T0 measured
            return False
        t0, c1, c2 = fit.solve()
        if t0 <= 0.0 or phase == 0:  # a probe, so that c1 and c2 stay measured
            fit.probed = self.probing = True
            return self._probe(fit)
        self.costs = (t0, c1, c2)
        self.threshold = MARGIN * c2 * num_rows / t0
        if self.threshold < 1.0:
            self._decided = fit  # its verdict: whether a row drafts (record)
            return True
        self.num_switched_off += 1  # no acceptance pays a draft token
        self._verdict(fit, False)
        return False

    def _probe(self, fit: _Fit) -> bool:
        fit.probes += 1
        self.cap = PROBE_TOKENS >> (fit.probes % 2)
        return True

    @staticmethod
    def _verdict(fit: _Fit, pays: bool) -> None:
        """The fit's decision on a step's drafts: after a probe, a no lengthens the probe
        interval; a yes shortens it again."""
        if pays:
            fit.probe_every = PROBE_EVERY
        elif fit.probed:
            fit.probe_every = min(2 * fit.probe_every, PROBE_MAX)
        fit.probed = False

    def row_tokens(self, req: Request, k: int) -> int:
        """How many of its k drafts a row may propose: while alpha**i reaches the threshold."""
        if self.threshold <= 0.0:
            return k
        alpha = acceptance(req)
        if alpha <= self.threshold:
            req.spec_refused *= ROW_DECAY  # sits out: drift back to the prior, to retry
            req.spec_accepted *= ROW_DECAY
            return 0
        if alpha >= 1.0:
            return k
        return min(k, int(math.log(self.threshold) / math.log(alpha)))

    def settle(self, batch: ScheduledBatch) -> None:
        """After the rows drafted: their drafts go unless the step's expected gain beats
        its verify cost (the blocks they took stay with their rows, for later tokens); a
        row whose drafts go drifts back to the prior, as one that sits out (row_tokens),
        else one poor patch would keep it from verifying, and so from recovering."""
        if self.costs is None or not batch.drafts:
            return
        t0, c1, c2 = self.costs
        drafted = [(batch.entries[r][0], len(d)) for r, d in batch.drafts.items()]
        gain = sum(_expected(acceptance(req), n) for req, n in drafted)
        tokens = sum(n for _, n in drafted)
        rows = batch.num_decode
        if (rows + gain) * t0 > MARGIN * rows * (t0 + c1 + c2 * tokens):
            return
        self.num_switched_off += 1
        for req, _ in drafted:
            batch.entries[req.request_id] = (req, 1)
            req.spec_refused *= ROW_DECAY
            req.spec_accepted *= ROW_DECAY
        batch.drafts = {}

    # ---- learning ----------------------------------------------------------
    def record(self, num_rows: int, num_drafts: int, seconds: float) -> None:
        """A decode-only step's wall time (steps with prompt tokens say nothing here)."""
        if self.adaptive and num_rows > 0:
            self.fits.setdefault(bucket(num_rows), _Fit()).add(num_drafts, seconds)
        if self._decided is not None:  # the fit allowed drafts: did any row take them?
            self._verdict(self._decided, num_drafts > 0)
            self._decided = None


def verified(
    req: Request, drafted: int, accepted: int, counters: EngineCounters | None = None
) -> None:
    """A row's verify: `accepted` of its `drafted` tokens (a geometric run: each accepted
    draft one success, the first refused one failure), counted on the request and the
    engine's counters (generation_tokens: the row's first token is counted elsewhere)."""
    req.num_draft_tokens += drafted
    req.num_accepted_tokens += accepted
    if counters is not None:
        counters.draft_tokens += drafted
        counters.accepted_tokens += accepted
        counters.generation_tokens += accepted
    req.spec_accepted = req.spec_accepted * ROW_DECAY + accepted
    req.spec_refused = req.spec_refused * ROW_DECAY + (1.0 if accepted < drafted else 0.0)


def acceptance(req: Request) -> float:
    s, f = req.spec_accepted + PRIOR[0], req.spec_refused + PRIOR[1]
    return s / (s + f)


def _expected(alpha: float, n: int) -> float:
    """Expected accepted tokens of n drafts, each accepted with alpha after the last was."""
    if alpha >= 1.0:
        return float(n)
    return alpha * (1.0 - alpha**n) / (1.0 - alpha)
