"""The command lines under scripts/ answer bad input with a usage message and exit code 2, never a
traceback. Each script's main() runs in this process (argparse exits with SystemExit(2))."""

import importlib.util
import sys
from pathlib import Path

import nbformat
import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load(name):
    spec = importlib.util.spec_from_file_location(
        f"_script_{name}", SCRIPTS / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPTS))
    return module


def exit_code(main, argv):
    try:
        return main(argv)
    except SystemExit as stop:
        return stop.code


@pytest.fixture
def bad_files(tmp_path):
    (tmp_path / "text.ipynb").write_text("not json\n")
    (tmp_path / "folder.ipynb").mkdir()
    (tmp_path / "notes.md").write_text("# notes\n")
    return tmp_path


def test_execute_notebooks_refuses_bad_paths(bad_files, capsys):
    main = load("execute_notebooks").main
    for argv, words in (
        ([], "required"),
        (["--bogus", "x.ipynb"], "unrecognized arguments"),
        ([str(bad_files / "missing.ipynb")], "no such notebook"),
        ([str(bad_files / "folder.ipynb")], "no such notebook"),
        ([str(bad_files / "notes.md")], "not a notebook"),
        ([str(bad_files / "text.ipynb")], "cannot be read as a notebook"),
    ):
        assert exit_code(main, argv) == 2, argv
        err = capsys.readouterr().err
        assert words in err and "usage:" in err, (argv, err)
        assert "Traceback" not in err


def test_execute_notebooks_checks_every_path_before_running_any(
    bad_files, capsys
):
    good = bad_files / "good.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), good)
    before = good.read_text()
    main = load("execute_notebooks").main
    assert exit_code(main, [str(good), str(bad_files / "no.ipynb")]) == 2
    assert "no such notebook" in capsys.readouterr().err
    assert good.read_text() == before  # not executed


def test_help_is_a_usage_message(capsys):
    for name in ("execute_notebooks", "make_figures", "page_stats"):
        assert exit_code(load(name).main, ["--help"]) == 0, name
        assert "usage:" in capsys.readouterr().out, name


def test_make_figures_takes_no_arguments(capsys):
    assert exit_code(load("make_figures").main, ["extra"]) == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_page_stats_refuses_a_missing_book_or_page(tmp_path, capsys):
    main = load("page_stats").main
    assert exit_code(main, ["--html", str(tmp_path)]) == 2
    assert "no built book" in capsys.readouterr().err
    (tmp_path / "index.html").write_text("<html></html>")
    assert exit_code(main, ["--html", str(tmp_path), "nothere.html"]) == 2
    assert "no such page" in capsys.readouterr().err


def test_record_hf_fixtures_refuses_unknown_families(capsys):
    script = load("record_hf_fixtures")
    main = script.main
    assert exit_code(main, ["no_such_family"]) == 2
    err = capsys.readouterr().err
    assert "unknown families" in err and "llama" in err
    assert exit_code(main, ["--help"]) == 0
    capsys.readouterr()
    if script.torch is None:  # the book's environment: no PyTorch
        assert exit_code(main, ["llama"]) == 2
        assert "requirements-fixtures.txt" in capsys.readouterr().err
