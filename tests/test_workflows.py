"""The GitHub workflows and the installer scripts they run, checked here since none of them can run here: each
workflow against the GitHub workflow schema (check-jsonschema's copy, offline), the actions it uses pinned to a
major version, the repository paths it names present, and the shell scripts through shellcheck where installed."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
SCRIPTS = sorted([*(ROOT / "installer").rglob("*.sh"), ROOT / "installer" / "linux" / "AppRun", ROOT / ".ci" / "run"])
USES = re.compile(r"^\s*(?:-\s+)?uses:\s*(\S+)", re.MULTILINE)
PINNED = re.compile(r"^[\w.-]+/[\w.-]+(?:/[\w./-]+)?@v\d+(?:\.\d+)*$")  # owner/repo[/path]@vN[.N...]
REPO_PATH = re.compile(r"(?<![\w./-])(installer[/\\][\w./\\-]+\.(?:sh|ps1|py|iss)|\.ci/run)")


def check_schema(*paths: Path) -> subprocess.CompletedProcess:
    """check-jsonschema's verdict on paths against its vendored GitHub workflow schema (no network)."""
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                           *map(str, paths)], capture_output=True, text=True, timeout=300)


def test_ci_and_release_workflows_exist():
    assert {p.name for p in WORKFLOWS} >= {"ci.yml", "release.yml"}


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_matches_the_github_schema(workflow):
    done = check_schema(workflow)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("breakage", [("runs-on:", "runs_on:"), ("timeout-minutes: 240", "timeout-minutes: soon"),
                                      ("\non:\n", "\nwhen:\n")], ids=["unknown-key", "wrong-type", "no-trigger"])
def test_schema_check_rejects_a_broken_workflow(tmp_path, breakage):
    old, new = breakage
    text = (ROOT / ".github" / "workflows" / "release.yml").read_text()
    assert old in text
    broken = tmp_path / "release.yml"
    broken.write_text(text.replace(old, new, 1))
    done = check_schema(broken)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Schema validation errors" in done.stdout + done.stderr


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_actions_are_pinned_to_a_major_version(workflow):
    uses = USES.findall(workflow.read_text())
    assert uses, "a workflow with no action at all is unexpected here"
    assert [u for u in uses if not PINNED.match(u)] == []


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_repository_paths_the_workflow_runs_exist(workflow):
    named = {p.replace("\\", "/") for p in REPO_PATH.findall(workflow.read_text())}
    assert named, "each workflow runs a script of the repository"
    assert sorted(p for p in named if not (ROOT / p).is_file()) == []


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_installer_scripts_pass_shellcheck():
    done = subprocess.run(["shellcheck", *map(str, SCRIPTS)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
