"""The command line as a user meets it: a version, and help written for users."""

from __future__ import annotations

from importlib.metadata import version

import pytest

from sluicegate.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as ended:
        main(list(argv))
    assert ended.value.code == 0
    return capsys.readouterr().out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "--version").strip() == f"sluicegate {version('sluicegate')}"


def test_the_help_says_what_the_gateway_is_for(capsys: pytest.CaptureFixture[str]) -> None:
    shown = run(capsys, "--help")
    assert "LLM gateway" in shown
    assert "owns its flags" not in shown, "no note on how the code is laid out"


def test_the_research_harness_is_not_a_command_of_the_package(
    capsys: pytest.CaptureFixture[str],
) -> None:
    shown = run(capsys, "bench", "--help")
    assert "family" not in shown
    assert "run" in shown
