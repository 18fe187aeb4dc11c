from common.auth import sign_rid, verify_rid


def test_signed_ids_verify_and_tampering_fails():
    rid = sign_rid("k" * 64, "cmpl-abc-0")
    assert rid.startswith("cmpl-abc-0.") and verify_rid("k" * 64, rid)
    base, _, tag = rid.rpartition(".")
    flipped = tag[:-1] + ("0" if tag[-1] != "0" else "1")
    for bad in (base, f"{base}.{flipped}", f"cmpl-abd-0.{tag}", rid + "0", "", ".", rid[:-1]):
        assert not verify_rid("k" * 64, bad), bad
    assert not verify_rid("other", rid)


def test_without_a_secret_ids_are_plain():
    assert sign_rid(None, "x-0") == "x-0" and verify_rid(None, "anything")
