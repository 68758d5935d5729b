"""API keys and user resolution (no engine needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferscale_memory.errors import ConfigError
from inferscale_memory.server.auth import ENV_VAR, ApiKeys, Principal, resolve_user
from inferscale_memory.server.errors import APIError


def test_keys_from_a_file_and_from_the_environment(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert ApiKeys.load() is None
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"sk-a": ["alice"], "sk-all": "*"}))
    keys = ApiKeys.load(path)
    assert keys is not None and len(keys) == 2
    assert keys.authenticate("Bearer sk-a").users == frozenset({"alice"})
    assert keys.authenticate("bearer  sk-all ").users is None
    monkeypatch.setenv(ENV_VAR, json.dumps({"sk-env": ["bob"]}))
    from_env = ApiKeys.load()
    assert from_env is not None and from_env.authenticate("Bearer sk-env").allows("bob")


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer sk-b", "Basic sk-a", "sk-a"])
def test_missing_or_unknown_keys_are_401(header: str | None) -> None:
    with pytest.raises(APIError) as caught:
        ApiKeys({"sk-a": ["alice"]}).authenticate(header)
    assert caught.value.status == 401 and caught.value.code == "invalid_api_key"


@pytest.mark.parametrize("mapping", [[], {"": ["a"]}, {"k": []}, {"k": "all"}, {"k": [1]},
                                     {"k": ["a", ""]}])
def test_malformed_key_files_are_config_errors(mapping: object) -> None:
    with pytest.raises(ConfigError):
        ApiKeys(mapping)  # type: ignore[arg-type]


def test_bad_key_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid JSON"):
        (tmp_path / "k.json").write_text("{nope")
        ApiKeys.load(tmp_path / "k.json")
    with pytest.raises(ConfigError, match="cannot read"):
        ApiKeys.load(tmp_path / "missing.json")
    (tmp_path / "empty.json").write_text("{}")
    with pytest.raises(ConfigError, match="no API keys"):
        ApiKeys.load(tmp_path / "empty.json")


def test_user_resolution() -> None:
    alice = Principal(frozenset({"alice"}))
    both = Principal(frozenset({"alice", "bob"}))
    anyone = Principal(None)
    assert resolve_user(alice, None, None) == "alice"  # the key's only user
    assert resolve_user(both, None, None) is None
    assert resolve_user(both, None, "bob") == "bob"
    assert resolve_user(anyone, "carol", "carol") == "carol"
    with pytest.raises(APIError) as forbidden:
        resolve_user(alice, "bob", None)
    assert forbidden.value.status == 403
    with pytest.raises(APIError) as mismatch:
        resolve_user(anyone, "bob", "carol")
    assert mismatch.value.status == 400
