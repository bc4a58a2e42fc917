"""`stageprof profile` prints who measured the stage: every process, joined by ", "."""

import pytest

from cli.commands.profile import print_result
from tests.store.factories import profile


def _fields(capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    out = capsys.readouterr().out
    return {
        line.split(maxsplit=1)[0]: line.split(maxsplit=1)[1].strip()
        for line in out.splitlines()
        if len(line.split(maxsplit=1)) == 2
    }


def test_measured_by_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    two = profile("fp").model_copy(
        update={"measured_by": ("a1b2c3d4e5f6:4242", "0f9e8d7c6b5a:4250")}
    )
    print_result(two, ["layer0"])
    assert _fields(capsys)["measured_by"] == "a1b2c3d4e5f6:4242, 0f9e8d7c6b5a:4250"
    print_result(profile("fp"), ["layer0"])
    assert _fields(capsys)["measured_by"] == "-"
