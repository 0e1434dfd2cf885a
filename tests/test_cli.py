"""Every command-line argument is validated by argparse: a bad value ends in one ``error:`` line, exit 2.

Before, ``io --N 0`` ended in a ZeroDivisionError, ``io --N -5`` printed negative counts, and
``demo --headdim 300``, ``io --d 0``, ``io --M 0``, ``io --Br 0`` and ``io --sparsity 2`` printed
tracebacks. Each bad flag runs in a fresh process, exactly as a user would type it.
"""

from __future__ import annotations

import os
import subprocess
import sys

from numba_flash import _launch, cli

import pytest

BAD = [
    ["io", "--N", "0"],
    ["io", "--N", "-5"],
    ["io", "--N", "ten"],
    ["io", "--d", "0"],
    ["io", "--M", "0"],
    ["io", "--Br", "0"],
    ["io", "--Bc", "-1"],
    ["io", "--sparsity", "2"],
    ["io", "--sparsity", "0"],
    ["io", "--sparsity", "nan"],
    ["io", "--measure", "--timeout", "0"],
    ["demo", "--headdim", "300"],
    ["demo", "--headdim", str(_launch.MAX_HEADDIM + 1)],
    ["demo", "--headdim", "0"],
    ["demo", "--seqlen", "0"],
    ["demo", "--batch", "-1"],
    ["demo", "--nheads", "0"],
    ["demo", "--repeats", "0"],
]


def run_cli(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "numba_flash", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ),
    )


@pytest.mark.parametrize("argv", BAD, ids=[" ".join(a) for a in BAD])
def test_bad_flag_ends_in_one_error_line_and_exit_status_2(argv):
    res = run_cli(*argv)
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr + res.stdout
    errors = [line for line in res.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, res.stderr
    assert errors[0].startswith(f"python -m numba_flash {argv[0]}: error: argument {argv[-2]}:"), errors[0]
    assert res.stdout == ""  # nothing ran


def test_headdim_limit_is_read_from_launch_when_parsing(monkeypatch):
    """The largest head dimension comes from ``_launch.MAX_HEADDIM`` at parse time, not a copy."""
    parser = cli.build_parser()
    assert parser.parse_args(["demo", "--headdim", str(_launch.MAX_HEADDIM)]).headdim == _launch.MAX_HEADDIM
    monkeypatch.setattr(_launch, "MAX_HEADDIM", 2 * _launch.MAX_HEADDIM)
    assert parser.parse_args(["demo", "--headdim", str(_launch.MAX_HEADDIM)]).headdim == _launch.MAX_HEADDIM


def test_io_with_good_flags_prints_the_table():
    res = run_cli("io", "--N", "64", "--d", "16", "--M", "4096", "--Br", "8", "--Bc", "16", "--sparsity", "1")
    assert res.returncode == 0, res.stderr
    assert "N = 64 (s_q = s_k), d = 16, M = 4,096 elements" in res.stdout
    assert "Br = 8, Bc = 16" in res.stdout


#: Usage errors that are not one argument's type: a name not in the gallery, a number out of range, a flag
#: that does nothing in its combination. Each is one ``error:`` line, exit 2, the close matches named.
BAD_COMBINATIONS = [
    (["bugs", "--show", "running_max"], "did you mean running-max-starts-at-zero?"),
    (["bugs", "--run", "nope"], "no bug named 'nope' in the gallery"),
    (["bugs", "--show", "0"], "no bug number 0 in the gallery: the numbers are 1 to"),
    (["bugs", "--show", "999"], "no bug number 999 in the gallery"),
    (["bugs", "--run-all", "--jobs", "0"], "--jobs must be at least 1, got 0"),
    (["bugs", "--run-all", "--jobs", "-3"], "--jobs must be at least 1, got -3"),
    (["bugs", "--gpu"], "--gpu only applies with --run-all"),
    (["bugs", "--show", "1", "--jobs", "2"], "--jobs only applies with --run-all"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_COMBINATIONS, ids=[" ".join(a) for a, _ in BAD_COMBINATIONS])
def test_bad_combination_or_name_ends_in_one_error_line_and_exit_status_2(argv, message):
    res = run_cli(*argv)
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr + res.stdout
    errors = [line for line in res.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0], res.stderr
    assert res.stdout == ""


def test_a_bug_is_shown_by_its_number_in_the_list():
    from tools import bugs

    res = run_cli("bugs", "--show", "2")
    assert res.returncode == 0, res.stderr
    assert f"[{bugs.GALLERY[1].name}]" in res.stdout.splitlines()[0]


def test_bugs_without_a_checkout_says_so_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(cli, "checkout_tool", lambda name: None)  # an installed wheel: no tools/ beside it
    with pytest.raises(SystemExit) as exc:
        cli.main(["bugs"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "error: the bug gallery needs a source checkout" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("M", "remark"), [(8, "below Theorem 2's range"), (64 * 64 * 4, "beyond Theorem 2's range"), (512, None)]
)
def test_io_remarks_when_M_leaves_theorem_2s_range(M, remark):
    res = run_cli("io", "--N", "64", "--d", "16", "--M", str(M))
    assert res.returncode == 0, res.stderr
    notes = [line for line in res.stdout.splitlines() if line.startswith("Note: M =")]
    if remark is None:
        assert notes == []
    else:
        assert len(notes) == 1 and remark in notes[0], notes
