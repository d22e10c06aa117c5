"""SCRAM-SHA-256, sans-IO: RFC 7677's test vector both ways, wrong passwords, and garbage never raising
anything but ScramError (the broker relies on that to answer and close instead of crashing)."""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path

import pytest

from metaq.errors import ConfigError
from metaq.security.credentials import UsersFile
from metaq.security.scram import ScramClient, ScramCredential, ScramError, ScramServer, make_credential

# RFC 7677, section 3
CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
SERVER_FIRST = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")


def rfc_credential() -> ScramCredential:
    return make_credential("pencil", salt=SALT, iterations=4096)


def test_client_side_of_the_rfc_7677_example() -> None:
    client = ScramClient("user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert client.first() == CLIENT_FIRST
    assert client.final(SERVER_FIRST) == CLIENT_FINAL
    client.verify(SERVER_FINAL)


def test_server_side_of_the_rfc_7677_example() -> None:
    server = ScramServer(nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    assert server.parse_first(CLIENT_FIRST) == "user"
    assert server.first(rfc_credential()) == SERVER_FIRST
    assert server.final(CLIENT_FINAL) == SERVER_FINAL


def exchange(client: ScramClient, server: ScramServer, credential: ScramCredential | None) -> None:
    server.parse_first(client.first())
    final = client.final(server.first(credential))
    client.verify(server.final(final))


def test_wrong_password_and_unknown_user_fail_alike_and_a_fake_server_is_caught() -> None:
    cred = make_credential("right")
    with pytest.raises(ScramError, match="wrong user name or password"):
        exchange(ScramClient("alice", "wrong"), ScramServer(), cred)
    with pytest.raises(ScramError, match="wrong user name or password"):
        exchange(ScramClient("nobody", "whatever"), ScramServer(), None)
    exchange(ScramClient("alice", "right"), ScramServer(), cred)
    # a server that does not hold the credential cannot produce the final signature
    client = ScramClient("alice", "right")
    impostor = ScramServer()
    impostor.parse_first(client.first())
    client.final(impostor.first(cred))
    with pytest.raises(ScramError, match="signature is wrong"):
        client.verify(b"v=" + base64.b64encode(b"x" * 32))
    assert "right" not in repr(cred) and b"right" not in json.dumps(cred.to_json()).encode()


def test_names_with_comma_and_equals_are_escaped() -> None:
    cred = make_credential("pw")
    server = ScramServer()
    client = ScramClient("a=b,c", "pw")
    assert b"n=a=3Db=2Cc," in client.first()
    server2 = ScramServer()
    assert server2.parse_first(ScramClient("a=b,c", "pw").first()) == "a=b,c"
    exchange(ScramClient("a=b,c", "pw"), server, cred)


def test_out_of_order_and_garbage_raise_only_scram_error() -> None:
    with pytest.raises(ScramError):
        ScramServer().final(CLIENT_FINAL)
    with pytest.raises(ScramError):
        ScramClient("u", "p").final(SERVER_FIRST)
    rng = random.Random(7677)
    valid = [CLIENT_FIRST, CLIENT_FINAL]
    for _ in range(3000):
        base = rng.choice(valid)
        kind = rng.randrange(4)
        if kind == 0:
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(80)))
        elif kind == 1:
            data = base[: rng.randrange(len(base))]
        elif kind == 2:
            data = bytearray(base)
            data[rng.randrange(len(data))] = rng.randrange(256)
            data = bytes(data)
        else:
            data = base * rng.randrange(1, 100)
        server = ScramServer()
        try:
            server.parse_first(data)
            server.first(rfc_credential() if rng.random() < 0.5 else None)
            server.final(bytes(rng.randrange(256) for _ in range(rng.randrange(120))) if rng.random() < 0.5 else data)
        except ScramError:
            pass


def test_credential_json_round_trip_and_damage(tmp_path: Path) -> None:
    cred = make_credential("pw")
    assert ScramCredential.from_json(cred.to_json()) == cred
    for damaged in ({}, {**cred.to_json(), "iterations": 1}, {**cred.to_json(), "stored_key": "@@"}, []):
        with pytest.raises(ValueError):
            ScramCredential.from_json(damaged)
    users = UsersFile(tmp_path / "users.json")
    assert users.lookup("alice") is None and users.names() == []
    assert users.put("alice", cred) is True
    assert users.put("alice", cred) is False
    assert users.lookup("alice") == cred and users.names() == ["alice"]
    assert (tmp_path / "users.json").stat().st_mode & 0o777 == 0o600
    assert users.remove("alice") and not users.remove("alice")
    (tmp_path / "users.json").write_text("{not json")
    with pytest.raises(ConfigError, match="damaged"):
        users.lookup("alice")
