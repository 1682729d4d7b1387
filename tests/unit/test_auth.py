"""API keys and tenants: the key file, `warmfleet keys add`, and who a caller is."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.enums import Priority
from common.errors import InvalidRequestError, UnauthenticatedError
from gateway.auth import LOCAL, KeyRing, Tenant, hash_key
from warmfleet.cli import main

KEY_A = "key-of-alice"


def write_keys(path: Path, *entries: str) -> Path:
    path.write_text("\n".join(f"[[keys]]\n{e}" for e in entries), encoding="utf-8")
    return path


def alice(**extra: object) -> str:
    fields = {"sha256": f'"{hash_key(KEY_A)}"', "tenant": '"alice"', **extra}
    return "\n".join(f"{k} = {v}" for k, v in fields.items())


def test_a_key_names_its_tenant_with_its_settings(tmp_path: Path) -> None:
    ring = KeyRing.load(
        write_keys(tmp_path / "k.toml", alice(max_priority='"batch"', weight=3, max_queued=5))
    )
    tenant = ring.tenant([("authorization", f"Bearer {KEY_A}")])
    assert tenant == Tenant("alice", Priority.BATCH, 3, 16, 5)
    assert ring.tenant([("authorization", f"bearer   {KEY_A} ")]).name == "alice"
    assert tenant.allows(Priority.BATCH) and not tenant.allows(Priority.NORMAL)
    assert ring.enabled and ring.tenants == ["alice"]


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ([], "missing 'authorization: Bearer KEY'"),
        ([("authorization", "Basic abc")], "must be 'Bearer KEY'"),
        ([("authorization", "Bearer ")], "must be 'Bearer KEY'"),
        ([("authorization", "Bearer someone-else")], "unknown API key"),
    ],
)
def test_no_or_unknown_key_is_refused(
    tmp_path: Path, metadata: list[tuple[str, str]], message: str
) -> None:
    ring = KeyRing.load(write_keys(tmp_path / "k.toml", alice()))
    with pytest.raises(UnauthenticatedError, match=message):
        ring.tenant(metadata)


def test_without_a_key_file_everyone_is_the_local_tenant() -> None:
    ring = KeyRing.open()
    assert not ring.enabled
    assert ring.tenant([]) == LOCAL and LOCAL.allows(Priority.INTERACTIVE)


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (["sha256 = 'abc'\ntenant = 'a'"], "sha256 must be 64 lowercase hex digits"),
        ([alice(tenant='"a/b"')], "tenant must be 1-64"),
        ([alice(tenant='"a:b"')], "tenant must be 1-64"),
        ([alice(max_priority='"urgent"')], "max_priority must be one of"),
        ([alice(weight=0)], "weight must be an integer >= 1"),
        ([alice(weight="true")], "weight must be an integer >= 1"),
        ([alice(colour='"red"')], "unknown field"),
        ([alice(), alice()], "the same key is listed twice"),
        (
            [alice(), f'sha256 = "{hash_key("other")}"\ntenant = "alice"\nweight = 2'],
            "tenant 'alice' has other settings elsewhere",
        ),
    ],
)
def test_a_bad_key_file_is_named_precisely(
    tmp_path: Path, entries: list[str], message: str
) -> None:
    with pytest.raises(InvalidRequestError, match=message) as err:
        KeyRing.load(write_keys(tmp_path / "k.toml", *entries))
    assert "k.toml, key" in str(err.value)


def test_unreadable_or_empty_key_files(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="cannot read"):
        KeyRing.load(tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_text("[[keys]\n", encoding="utf-8")
    with pytest.raises(InvalidRequestError, match="not valid TOML"):
        KeyRing.load(tmp_path / "bad.toml")
    (tmp_path / "empty.toml").write_text("", encoding="utf-8")
    with pytest.raises(InvalidRequestError, match="no \\[\\[keys\\]\\] entries"):
        KeyRing.load(tmp_path / "empty.toml")


def test_keys_add_prints_the_key_once_and_stores_its_hash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "keys.toml"
    assert main(["keys", "add", "--file", str(path), "--tenant", "alice"]) == 0
    key_a = capsys.readouterr().out.strip()
    args = ["--tenant", "bob", "--max-priority", "batch", "--weight", "2"]
    assert main(["keys", "add", "--file", str(path), *args]) == 0
    key_b = capsys.readouterr().out.strip()
    text = path.read_text(encoding="utf-8")
    assert key_a not in text and hash_key(key_a) in text  # stored hashed only
    assert path.stat().st_mode & 0o777 == 0o600
    ring = KeyRing.load(path)
    assert ring.tenant([("authorization", f"Bearer {key_a}")]) == Tenant("alice", Priority.NORMAL)
    assert ring.tenant([("authorization", f"Bearer {key_b}")]) == Tenant("bob", Priority.BATCH, 2)
    assert main(["keys", "add", "--file", str(path), "--tenant", "b/ad"]) == 2
    assert path.read_text(encoding="utf-8") == text  # a refused key changes nothing
