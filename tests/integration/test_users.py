"""Named users and console sessions in the store, on both backends: users with a role
and an Argon2id password hash (never the password), checked names, roles and
passwords; sessions found by the digest of their token, ended by logout, expiry, idle
time and their user's being disabled, removed or given a new password, with the user's
role as it is now."""

from __future__ import annotations

import hashlib

import pytest
import sqlalchemy as sa

from messagebox import MessageBox
from messagebox.errors import AlreadyExists, UnknownUser, UserDisabled, ValidationError
from messagebox.ops import passwords, users
from messagebox.ops.accounts import bound_to
from messagebox.storage import schema

PASSWORD = "correct horse battery"
HOUR = 3600.0


def rows(box: MessageBox, table: sa.Table) -> list[dict[str, object]]:
    with box.store.transaction() as conn:
        return [dict(r._mapping) for r in conn.execute(sa.select(table))]


def test_a_user_is_stored_with_its_role_and_a_hash_never_the_password(box: MessageBox) -> None:
    made = box.add_user("alice", "operator", PASSWORD)
    assert (made.name, made.role, made.disabled) == ("alice", "operator", False)
    assert box.users() == [made]
    assert box.user("alice") == made
    [row] = rows(box, schema.user)
    stored = str(row["password_hash"])
    assert stored.startswith("$argon2id$")
    assert PASSWORD not in repr(row)
    assert "password" not in repr(made).lower()
    assert box.authenticate("alice", PASSWORD) == made
    assert box.has_users()


def test_names_roles_and_passwords_are_checked_before_anything_is_stored(
    box: MessageBox,
) -> None:
    bad = [
        ("", "reader", PASSWORD, "must not be empty"),
        ("Alice", "reader", PASSWORD, "did you mean 'alice'?"),
        ("a" * 65, "reader", PASSWORD, "at most 64 characters"),
        ("x" * 100_000, "reader", PASSWORD, "this one has 100,000"),
        ("al ice", "reader", PASSWORD, "lowercase letters, digits"),
        ("token:admin", "reader", PASSWORD, "is not a user's name"),
        ("al\x00ice", "reader", PASSWORD, "'al\\x00ice'"),
        ("alice", "admni", PASSWORD, "did you mean 'admin'?"),
        ("alice", "root", PASSWORD, "one of: reader, operator, admin"),
        ("alice", "reader", "", "must not be empty"),
        ("alice", "reader", "Xy7#q", "at least 10 characters"),
        ("alice", "reader", "x" * 1025, "at most 1024 characters"),
        ("alice", "reader", "tab\there and more", "control characters"),
        ("alice", "reader", "alice-is-great", "the user's name"),
        ("alice", "reader", "Password123!", "too easily guessed"),
        ("alice", "reader", "aaaaaaaaaaaaaaa", "too easily guessed"),
    ]
    for name, role, password, why in bad:
        with pytest.raises(ValidationError) as refused:
            box.add_user(name, role, password)
        assert why in str(refused.value), (name[:20], role, why)
        assert len(str(refused.value)) < 300  # a huge input is not quoted whole
        assert password not in str(refused.value) or not password
    assert box.users() == []
    box.add_user("alice", "reader", PASSWORD)
    with pytest.raises(AlreadyExists, match="'alice' exists already"):
        box.add_user("alice", "admin", "another good one")


def test_authenticate_tells_no_more_than_right_or_wrong(box: MessageBox) -> None:
    box.add_user("alice", "reader", PASSWORD)
    assert box.authenticate("alice", PASSWORD) is not None
    assert box.authenticate("alice", PASSWORD + "!") is None
    assert box.authenticate("bob", PASSWORD) is None  # unknown: the same answer
    assert box.authenticate("Not A Name\x00", PASSWORD) is None
    assert box.authenticate("alice", "x" * 1_000_000) is None  # never hashed whole
    box.set_user_disabled("alice")
    assert box.authenticate("alice", "wrong password") is None
    with pytest.raises(UserDisabled):
        box.authenticate("alice", PASSWORD)
    box.set_user_disabled("alice", False)
    assert box.authenticate("alice", PASSWORD) is not None


def test_a_hash_of_older_parameters_is_made_again_at_login(
    box: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    from argon2 import PasswordHasher

    monkeypatch.setattr(passwords, "HASHER", PasswordHasher(time_cost=1, memory_cost=8192))
    box.add_user("alice", "reader", PASSWORD)
    [old] = rows(box, schema.user)
    monkeypatch.undo()
    assert box.authenticate("alice", PASSWORD) is not None
    [new] = rows(box, schema.user)
    assert new["password_hash"] != old["password_hash"]
    assert not passwords.needs_rehash(str(new["password_hash"]))


def test_roles_and_unknown_users(box: MessageBox) -> None:
    box.add_user("alice", "reader", PASSWORD)
    assert box.set_user_role("alice", "admin").role == "admin"
    with pytest.raises(ValidationError, match="did you mean 'operator'"):
        box.set_user_role("alice", "operater")
    for change in (
        lambda: box.user("alise"),
        lambda: box.set_user_role("alise", "reader"),
        lambda: box.set_user_disabled("alise"),
        lambda: box.remove_user("alise"),
        lambda: box.set_user_password("alise", PASSWORD),
    ):
        with pytest.raises(UnknownUser, match="did you mean 'alice'"):
            change()
    box.remove_user("alice")
    assert box.users() == []
    assert not box.has_users()


def test_a_session_is_kept_by_the_digest_of_its_token(box: MessageBox) -> None:
    box.add_user("alice", "operator", PASSWORD)
    token = box.open_session("alice", "operator", lifetime=HOUR)
    found = box.find_session(token, idle=HOUR)
    assert found is not None
    assert (found.who, found.role) == ("alice", "operator")
    [row] = rows(box, schema.session)
    assert row["id"] == hashlib.sha256(token.encode()).hexdigest()
    assert token not in repr(row)
    assert box.find_session(token[:-1] + ("A" if token[-1] != "A" else "B"), idle=HOUR) is None
    for garbage in ("", "x", "../../etc", "\x00" * 40, "a" * 10_000):
        assert box.find_session(garbage, idle=HOUR) is None
        box.close_session(garbage)  # nothing
    box.close_session(token)
    assert box.find_session(token, idle=HOUR) is None
    assert rows(box, schema.session) == []


def test_a_session_takes_its_user_s_role_now_and_ends_with_the_user(box: MessageBox) -> None:
    box.add_user("alice", "reader", PASSWORD)
    box.add_user("bob", "reader", PASSWORD)
    for end in (
        lambda: box.set_user_disabled("alice"),
        lambda: box.set_user_password("alice", "a new good secret"),
        lambda: box.remove_user("alice"),
    ):
        if not box.users() or box.users()[0].name != "alice":
            box.add_user("alice", "reader", PASSWORD)
        box.set_user_disabled("alice", False)
        token = box.open_session("alice", "reader", lifetime=HOUR)
        other = box.open_session("bob", "reader", lifetime=HOUR)
        box.set_user_role("alice", "admin")
        found = box.find_session(token, idle=HOUR)
        assert found is not None
        assert found.role == "admin"  # the role as it is now
        end()
        assert box.find_session(token, idle=HOUR) is None  # at once
        assert box.find_session(other, idle=HOUR) is not None  # bob's goes on
        assert box.open_sessions().get("alice", 0) == 0


def test_a_session_expires_after_its_lifetime_and_when_idle(box: MessageBox) -> None:
    box.add_user("alice", "reader", PASSWORD)
    old = box.open_session("alice", "reader", lifetime=HOUR)
    idle = box.open_session("alice", "reader", lifetime=HOUR)
    s = schema.session
    now_plus = box.store.dialect.now_plus
    with box.store.transaction() as conn:  # as if an hour had passed, and ten minutes
        digest = hashlib.sha256(old.encode()).hexdigest()
        conn.execute(s.update().where(s.c.id == digest).values(expires_at=now_plus(-1.0)))
        digest = hashlib.sha256(idle.encode()).hexdigest()
        conn.execute(s.update().where(s.c.id == digest).values(last_seen=now_plus(-600.0)))
    assert box.find_session(old, idle=HOUR) is None
    assert box.find_session(idle, idle=300) is None  # idle past five minutes
    found = box.find_session(idle, idle=HOUR)  # an hour's idle time: still open, and seen
    assert found is not None
    assert box.find_session(idle, idle=300) is not None
    with pytest.raises(ValidationError, match="a session lasts"):
        box.open_session("alice", "reader", lifetime=10.0)
    box.open_session("alice", "reader", lifetime=HOUR)  # forgets the expired one
    assert len(rows(box, s)) == 2


def test_one_user_keeps_a_bounded_number_of_sessions(
    box: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(users, "MAX_SESSIONS", 3)
    box.add_user("alice", "reader", PASSWORD)
    tokens = [box.open_session("alice", "reader", lifetime=HOUR) for _ in range(5)]
    assert box.open_sessions() == {"alice": 3}
    assert box.find_session(tokens[-1], idle=HOUR) is not None


def test_a_token_s_session_is_bound_to_that_token(box: MessageBox) -> None:
    token = box.open_session("token:admin", "admin", lifetime=HOUR, secret="s3cret")
    found = box.find_session(token, idle=HOUR)
    assert found is not None
    assert found.role == "admin"  # no user row: the session's own role
    assert bound_to(found, token, "s3cret")
    assert not bound_to(found, token, "rotated")
    assert not bound_to(found, token, None)
    assert "s3cret" not in repr(rows(box, schema.session))
    assert box.close_sessions("token:admin") == 1


def test_a_session_used_by_many_requests_at_once_stays_open(box: MessageBox) -> None:
    from concurrent.futures import ThreadPoolExecutor

    box.add_user("alice", "reader", PASSWORD)
    token = box.open_session("alice", "reader", lifetime=HOUR)
    s = schema.session
    for _ in range(5):
        with box.store.transaction() as conn:  # unseen for a minute: each request marks it
            conn.execute(s.update().values(last_seen=box.store.dialect.now_plus(-60.0)))
        with ThreadPoolExecutor(8) as pool:
            found = list(pool.map(lambda _: box.find_session(token, idle=HOUR), range(16)))
        assert all(f is not None and f.who == "alice" for f in found)
    assert box.open_sessions() == {"alice": 1}
