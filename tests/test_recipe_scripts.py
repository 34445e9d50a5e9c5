"""The verl recipe's scripts as a user runs them, without verl (recipe/spiral/run_*.sh, prepare_data.py): --help prints
help and does nothing else; a bad argument or an unwritable --out is one line, exit 2, before any work, nothing
written. tests/test_verl_recipe.py runs them with verl (main_spiral's own checks, prepare_data's parquet)."""

import pytest

from recipe.spiral import prepare_data


def test_prepare_data_help_prints_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        prepare_data.main(["--help"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("usage: prepare_data.py")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("flags, message", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--out", "FILE/data"], "is not a directory"),
    (["--out", ""], "an empty path"),
])
def test_prepare_data_bad_input_is_one_line_before_reading(flags, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "FILE").write_text("mine")
    monkeypatch.setattr(prepare_data, "rows", lambda *a: pytest.fail("read the problems on bad input"))
    assert prepare_data.main(flags) == 2
    err = capsys.readouterr().err
    assert err.startswith("prepare_data.py: error: ") and message in err and err.count("\n") == 1, err
    assert [p.name for p in tmp_path.iterdir()] == ["FILE"] and (tmp_path / "FILE").read_text() == "mine"
