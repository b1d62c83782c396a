"""`llamadesk pull` as a user runs it: a real process against the hub stand-in (HF_ENDPOINT), no server."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from tests.hubstandin import HubStandIn, Repo


@pytest.fixture(scope="module")
def hub(assets):
    tiny = assets["tiny"].read_bytes()
    srv = HubStandIn({"standin/Tiny-GGUF": Repo(files={"tiny-Q4_K_M.gguf": tiny, "tiny-Q8_0.gguf": tiny}),
                      "standin/Gated-GGUF": Repo(files={"gated-Q4_K_M.gguf": tiny}, gated=True),
                      "standin/Bad-GGUF": Repo(files={"bad-Q4_K_M.gguf": tiny},
                                               reported_sha256={"bad-Q4_K_M.gguf": "0" * 64})})
    yield srv
    srv.close()


def run_pull(tmp_path, hub, *args: str, toml: str = "", token: str | None = None) -> subprocess.CompletedProcess:
    cfg = tmp_path / "llamadesk.toml"
    cfg.write_text(toml)
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    env |= {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf-home")}
    if token is not None:
        env["HF_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "app", "pull", *args, "--config", str(cfg),
                           "--models-dir", str(tmp_path / "models")],
                          capture_output=True, text=True, env=env, timeout=300)


def test_pull_fetches_and_verifies_the_default_quant(tmp_path, hub, assets):
    r = run_pull(tmp_path, hub, "standin/Tiny-GGUF")
    assert r.returncode == 0, r.stderr
    path = tmp_path / "models" / "tiny-Q4_K_M.gguf"
    assert path.read_bytes() == assets["tiny"].read_bytes()
    assert (tmp_path / "models" / "tiny-Q4_K_M.gguf.sha256").read_text().split()[0] == \
        hashlib.sha256(path.read_bytes()).hexdigest()
    assert "'tiny-Q4_K_M'" in r.stdout and "sha256 verified" in r.stdout
    assert "pulling tiny-Q4_K_M.gguf" in r.stderr and "verifying sha256 digest" in r.stderr
    r = run_pull(tmp_path, hub, "standin/Tiny-GGUF/tiny-Q8_0.gguf")  # the file form
    assert r.returncode == 0 and (tmp_path / "models" / "tiny-Q8_0.gguf").exists(), r.stderr


def test_a_gated_repo_without_a_token_exits_1_naming_hf_token(tmp_path, hub):
    r = run_pull(tmp_path, hub, "standin/Gated-GGUF:Q4_K_M")
    assert r.returncode == 1 and "HF_TOKEN" in r.stderr and "401" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "models" / "gated-Q4_K_M.gguf").exists()
    r = run_pull(tmp_path, hub, "standin/Gated-GGUF:Q4_K_M", token=hub.token)
    assert r.returncode == 0, r.stderr


def test_the_token_may_come_from_the_config(tmp_path, hub):
    r = run_pull(tmp_path, hub, "standin/Gated-GGUF", toml=f'hf_token = "{hub.token}"\n')
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "models" / "gated-Q4_K_M.gguf").exists()


def test_a_wrong_sha256_exits_1_and_keeps_nothing(tmp_path, hub):
    r = run_pull(tmp_path, hub, "standin/Bad-GGUF")
    assert r.returncode == 1 and "sha256 mismatch" in r.stderr and "Traceback" not in r.stderr
    assert not list((tmp_path / "models").glob("bad-*"))


@pytest.mark.parametrize("name, code, words", [("not-a-repo", 2, "owner/name"), ("standin/Tiny-GGUF:Q3_K_S", 1, "Q4_K_M")])
def test_a_bad_name_says_why(tmp_path, hub, name, code, words):
    r = run_pull(tmp_path, hub, name)
    assert r.returncode == code and words in r.stderr and "Traceback" not in r.stderr
