"""What the CLI tests share (tests/test_cli.py, test_lab_cli.py); the user modules they run
are the `user_module` fixture (tests/conftest.py)."""

import pytest

from toast_lab.cli import main


def usage_error(argv, capsys) -> str:
    """The one line a usage error prints; asserts exit status 2 and nothing else printed."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("toast-lab: "), err
    return lines[0]
