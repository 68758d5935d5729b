"""The PostgreSQL store's config fields: ``store`` and ``postgres_url``, from kwargs, env
and a JSON file like every field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferscale_memory.config import MemoryConfig
from inferscale_memory.errors import ConfigError

URL = "postgresql://memory:s3cret@db:5432/memory"


def test_store_fields_from_kwargs_env_and_file(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    assert MemoryConfig.load().store == "sqlite"
    cfg = MemoryConfig.load(store="postgres", postgres_url=URL, index="hnsw")
    assert (cfg.store, cfg.postgres_url, cfg.index) == ("postgres", URL, "hnsw")
    assert "s3cret" not in repr(cfg)
    file = tmp_path / "config.json"
    file.write_text(json.dumps({"store": "postgres", "postgres_url": URL}))
    assert MemoryConfig.load(file).postgres_url == URL
    monkeypatch.setenv("INFERSCALE_STORE", "postgres")
    monkeypatch.setenv("INFERSCALE_POSTGRES_URL", URL + "2")
    assert MemoryConfig.load(file).postgres_url == URL + "2"  # env over file


@pytest.mark.parametrize(("values", "message"), [
    ({"store": "mysql"}, "store: Input should be 'sqlite' or 'postgres'"),
    ({"store": "postgres"}, "needs postgres_url"),
    ({"store": "postgres", "postgres_url": "db:5432"}, "postgres_url: String should match"),
    ({"postgres_url": URL}, "store is 'sqlite'"),
    ({"index": "hnsw"}, "set store='postgres'"),
    ({"store": "postgres", "postgres_url": URL, "index": "qdrant"}, "needs qdrant_url"),
])
def test_bad_store_fields_are_config_errors(values: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        MemoryConfig.load(**values)
