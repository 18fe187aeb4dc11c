"""Signed request ids: only requests the frontend accepted are generated.

With `ipc.secret` set (launch.py sets a fresh random one per launch; deployments put one
in the shared config file, readable by the service user only), every engine request id
is `<base>.<tag>` where tag = HMAC-SHA256(secret, base), truncated to 128 bits. The
scheduler drops a GenerateRequest whose tag does not verify (constant-time compare), so a
process that can reach the scheduler's socket but not the secret cannot make it generate,
and cannot name (so abort or read) a request it did not create: ids carry 128 random bits
of uuid plus the tag. Without a secret, ids are unsigned and the private 0700 run dir is
the only barrier (fine for ipc://; tcp:// across hosts needs a secret and a private
network).

A signed id is also the proof that a request came through the frontend's intake, where
its parameters were validated once (`passed_intake`): the tokenizer workers and the
engine check again only what nothing proves, requests with unsigned ids (no secret).
"""

from __future__ import annotations

import hashlib
import hmac

TAG_HEX = 32  # 128 bits


def _tag(secret: str, base: str) -> str:
    return hmac.new(secret.encode(), base.encode(), hashlib.sha256).hexdigest()[:TAG_HEX]


def sign_rid(secret: str | None, base: str) -> str:
    return base if not secret else f"{base}.{_tag(secret, base)}"


def verify_rid(secret: str | None, rid: str) -> bool:
    if not secret:
        return True
    base, sep, tag = rid.rpartition(".")
    return bool(sep) and len(tag) == TAG_HEX and hmac.compare_digest(tag, _tag(secret, base))


def passed_intake(secret: str | None, rid: str) -> bool:
    """The frontend signed `rid`, so it validated the request's parameters: a receiver
    need not check them again. Without a secret nothing proves it (False)."""
    return bool(secret) and verify_rid(secret, rid)


def replica_proof(secret: str | None, replica: int, pid: int) -> str | None:
    """What a scheduler replica shows the frontend to join: the secret, bound to its id
    and pid (so a frame copied off the wire names that process only)."""
    return _tag(secret, f"replica:{replica}:{pid}") if secret else None


def verify_replica(secret: str | None, replica: int, pid: int, proof: str | None) -> bool:
    if not secret:
        return True
    return proof is not None and hmac.compare_digest(
        proof, _tag(secret, f"replica:{replica}:{pid}")
    )
