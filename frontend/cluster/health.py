"""/health's "components" from the cluster table: per component alive and last seen,
per scheduler replica its load, the tokenizer workers counted (and those refused)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from frontend.cluster.table import Cluster


def health_report(cluster: Cluster, now: float) -> dict[str, Any]:
    """The report at monotonic time `now`."""
    missing = cluster.missing(now)

    def age(seen: float | None) -> float | None:
        return None if seen is None or seen == float("-inf") else round(now - seen, 3)

    replicas = {}
    for k, e in cluster.engines().items():
        replicas[str(k)] = {
            "alive": cluster.alive(f"scheduler.{k}", now),
            "last_seen_s": age(cluster.last_seen(f"scheduler.{k}")),
            "pid": e.pid,
            "inbox": e.inbox,
            "device": e.device,
            "gpus": e.gpus,
            "num_requests_running": e.num_running,
            "num_requests_waiting": e.num_waiting,
            "kv_cache_usage": round(e.kv_usage, 4),
        }
    seen = [cluster.last_seen(f"scheduler.{k}") for k in replicas]
    tokenizers = cluster.tokenizers()
    return {
        "scheduler": {
            "alive": "scheduler" not in missing,
            "last_seen_s": age(max((t for t in seen if t is not None), default=None)),
            "replicas": replicas,
        },
        "tokenizer": {
            "alive": "tokenizer" not in missing,
            "last_seen_s": age(
                max(
                    (t for m in tokenizers.values() if (t := m.last_seen) is not None),
                    default=None,
                )
            ),
            "workers": sum(1 for n in tokenizers if cluster.alive(n, now)),
            **(
                {"refused": refused}
                if (refused := sum(1 for m in tokenizers.values() if m.refused))
                else {}
            ),
        },
        "detok": {"alive": "detok" not in missing, "last_seen_s": age(cluster.last_seen("detok"))},
    }
