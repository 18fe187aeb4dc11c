"""The target checks on the first server row: PASS, FAIL, or SKIP without data."""

from __future__ import annotations

from typing import Any

THROUGHPUT_TARGET = 0.9  # server output tok/s >= this x offline
FORWARD_TARGET = 0.9  # forward share of scheduler busy time under the main load
TTFT_SLACK_MS = 15.0  # one-at-a-time TTFT p50 <= in-process prefill + this


def evaluate_checks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The three targets, on the first server row (b): PASS, FAIL, or SKIP without data."""
    offline = next((r for r in rows if r["key"] == "offline" and r["status"] == "ok"), None)
    b = next((r for r in rows if r["key"].startswith("server")), None)

    def check(name: str, target: str, needs_offline: bool, fn) -> dict[str, Any]:
        out: dict[str, Any] = {"name": name, "target": target, "row": b and b["label"]}
        missing = []
        if b is None or b["status"] != "ok":
            missing.append("no server row ran" if b is None else f"({b['label']}) did not run")
        if needs_offline and offline is None:
            missing.append("the offline row (a) did not run")
        if missing:
            return {**out, "status": "SKIP", "value": None, "detail": "; ".join(missing)}
        try:
            passed, value, detail = fn()
        except (TypeError, KeyError) as e:  # a figure that is None or absent: no data
            return {**out, "status": "SKIP", "value": None, "detail": f"no data ({e!r})"}
        return {**out, "status": "PASS" if passed else "FAIL", "value": value, "detail": detail}

    def thr():
        ratio = b["output_tok_s"] / offline["output_tok_s"]
        return (
            ratio >= THROUGHPUT_TARGET,
            ratio,
            f"{b['output_tok_s']:.1f} / {offline['output_tok_s']:.1f} tok/s = {ratio:.2f}x",
        )

    def fwd():
        share = b["forward_share"]
        parts = ", ".join(f"{p} {v:.1%}" for p, v in b["busy"]["shares"].items() if v is not None)
        return share >= FORWARD_TARGET, share, f"{share:.1%} ({parts})"

    def ttft():
        pt = b.get("paired_ttft")
        if pt:
            over, p50, pre = pt["median_overhead_ms"], pt["median_ttft_ms"], pt["median_prefill_ms"]
            return (
                over <= TTFT_SLACK_MS,
                over,
                f"paired, each request after an in-process prefill of its prompt: median "
                f"overhead {over:+.1f} ms (TTFT p50 {p50:.1f} ms, in-process prefill p50 "
                f"{pre:.1f} ms)",
            )
        p50, pre = b["ttft_p50_ms"], offline["prefill"]["mean_ms"]
        return (
            p50 <= pre + TTFT_SLACK_MS,
            p50 - pre,
            f"{p50:.1f} ms vs {pre:.1f} + {TTFT_SLACK_MS:.0f} = {pre + TTFT_SLACK_MS:.1f} ms "
            f"(overhead {p50 - pre:+.1f} ms)",
        )

    return [
        check(
            "server_throughput",
            f"server output tok/s >= {THROUGHPUT_TARGET}x offline (a)",
            True,
            thr,
        ),
        check(
            "forward_share",
            f"forward >= {FORWARD_TARGET:.0%} of scheduler busy time under the main load",
            False,
            fwd,
        ),
        check(
            "ttft_overhead",
            f"one-at-a-time TTFT p50 <= in-process prefill + {TTFT_SLACK_MS:.0f} ms",
            True,
            ttft,
        ),
    ]
