"""The users and ACL files, damaged: every byte flipped in turn costs the user or the entry whose line holds
it and no other; a damaged ACL line never widens access (a lost deny refuses its principal, an unreadable one
refuses everyone but the super-users); damaged lines are kept, not dropped, by later changes; files of the
earlier JSON form are still read."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from metaq.security.acl import AclEntry, AclFile, Acls, decode_acls
from metaq.security.credentials import UsersFile
from metaq.security.scram import MIN_ITERATIONS, make_credential

USERS = ["alice", "bob", "carol"]


def _users(path: Path) -> bytes:
    users = UsersFile(path)
    for name in USERS:
        users.put(name, make_credential(f"pw-{name}", iterations=MIN_ITERATIONS))
    return path.read_bytes()


def test_every_flipped_byte_of_the_users_file_costs_only_that_user(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    clean = _users(path)
    originals = {name: UsersFile(path).lookup(name) for name in USERS}
    lines = clean.split(b"\n")[:-1]
    starts = list(itertools.accumulate([0] + [len(line) + 1 for line in lines]))
    for i in range(len(clean)):
        damaged = bytearray(clean)
        damaged[i] ^= 0xFF
        path.write_bytes(bytes(damaged))
        k = next(n for n in range(len(lines)) if starts[n] <= i < starts[n + 1])
        found = {name: UsersFile(path).lookup(name) for name in USERS}
        lost = [name for name in USERS if found[name] is None]
        if i == starts[k + 1] - 1 and k < len(lines) - 1:  # a newline: split again
            assert not lost, i
            continue
        assert lost == [USERS[k]], (i, lost)
        assert all(found[name] == originals[name] for name in USERS if name != USERS[k])


def test_a_change_keeps_a_damaged_line_until_that_user_is_added_again(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    clean = _users(path)
    damaged = bytearray(clean)
    damaged[clean.index(b'"user":"bob"') - 30] ^= 0x01  # in bob's key material
    path.write_bytes(bytes(damaged))
    users = UsersFile(path)
    assert users.check() == (2, ["line 2 (user bob) is damaged"])
    users.put("dave", make_credential("pw", iterations=MIN_ITERATIONS))
    assert users.check()[1] == ["line 4 (user bob) is damaged"], "kept, not dropped"
    users.put("bob", make_credential("new", iterations=MIN_ITERATIONS))
    assert users.check() == (4, []) and users.lookup("bob") is not None


def test_a_users_file_of_the_earlier_form_is_read_and_rewritten_as_lines(tmp_path: Path) -> None:
    cred = make_credential("pw", iterations=MIN_ITERATIONS)
    path = tmp_path / "users.json"
    path.write_text(json.dumps({"users": {"alice": cred.to_json()}}))
    users = UsersFile(path)
    assert users.lookup("alice") == cred
    users.put("bob", cred)
    assert path.read_bytes()[:1] != b"{" and UsersFile(path).names() == ["alice", "bob"]


ENTRIES = [
    AclEntry("User:alice", "topic", "orders", "produce"),
    AclEntry("User:alice", "topic", "orders-secret", "all", "deny"),
    AclEntry("User:bob", "topic", "orders", "consume"),
    AclEntry("User:*", "topic", "orders-", "describe", "allow", "prefix"),
    AclEntry("User:*", "group", "g", "consume", "deny"),
]
QUESTIONS = [(p, rt, name, op) for p in ("User:alice", "User:bob", "User:eve", "User:root")
             for rt, name in (("topic", "orders"), ("topic", "orders-secret"), ("topic", "orders-x"), ("group", "g"))
             for op in ("produce", "consume", "describe", "admin")]


def test_every_flipped_byte_of_the_acl_file_never_widens_access(tmp_path: Path) -> None:
    path = tmp_path / "acls.json"
    store = AclFile(path)
    for entry in ENTRIES:
        store.update("add", entry)
    clean = path.read_bytes()
    full = decode_acls(clean, ["User:root"])
    assert full.entries == tuple(ENTRIES) and not full.refused
    allowed = {q for q in QUESTIONS if full.allows(*q)}
    lines = clean.split(b"\n")[:-1]
    starts = list(itertools.accumulate([0] + [len(line) + 1 for line in lines]))
    for i in range(len(clean)):
        damaged = bytearray(clean)
        damaged[i] ^= 0xFF
        acls = decode_acls(bytes(damaged), ["User:root"])
        k = next(n for n in range(len(lines)) if starts[n] <= i < starts[n + 1])
        assert {q for q in QUESTIONS if acls.allows(*q)} <= allowed, f"byte {i} widened access"
        assert all(acls.allows(*q) for q in QUESTIONS if q[0] == "User:root"), "super-users keep everything"
        if i == starts[k + 1] - 1 and k < len(lines) - 1:
            assert acls.entries == full.entries, i
            continue
        assert acls.entries == tuple(e for n, e in enumerate(ENTRIES) if n != k), i
        if i - starts[k] < 8 and ENTRIES[k].permission == "allow":  # the key vouched for: only that entry is lost
            assert not acls.refused, i
        if i - starts[k] < 8 and ENTRIES[k].permission == "deny":
            assert acls.refused == {ENTRIES[k].principal}, i


def test_an_acl_file_keeps_its_damaged_lines_through_changes(tmp_path: Path) -> None:
    path = tmp_path / "acls.json"
    store = AclFile(path)
    for entry in ENTRIES[:2]:
        store.update("add", entry)
    data = bytearray(path.read_bytes())
    data[3] ^= 0x01  # the first line's checksum: the key (allow User:alice) is still vouched for
    path.write_bytes(bytes(data))
    store.update("add", ENTRIES[2])
    assert store.check() == (2, ["line 3 (a allow User:alice entry) is damaged"])
    assert isinstance(decode_acls(path.read_bytes()), Acls)
