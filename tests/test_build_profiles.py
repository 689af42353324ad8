"""tools/build_profiles.py assembles the built-in profiles from datasheet values and committed fit results; a GPU
check's data enters only when committed and named with --gpu-check."""

from __future__ import annotations

import json

import pytest

from tools import build_profiles as B


@pytest.mark.parametrize("make,needle", [
    (lambda p: p / "nothing-here", "expected calib/data/<built-in profile>-gpu-check"),
    (lambda p: p / "h200-sxm-gpu-check", "no fit.json"),
])
def test_gpu_check_bad_dirs_exit_2(tmp_path, capsys, make, needle):
    d = make(tmp_path)
    d.mkdir()
    assert B.main(["--check", "--gpu-check", str(d)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err


def test_an_untracked_gpu_check_is_refused(tmp_path, capsys):
    """A fit.json git does not track never changes a built-in profile, even when named."""
    d = tmp_path / "h200-sxm-gpu-check"
    d.mkdir()
    (d / "fit.json").write_text(json.dumps({"provenance": {}, "params": {}}))
    assert B.main(["--check", "--gpu-check", str(d)]) == 2
    assert "is not committed" in capsys.readouterr().err


def test_nothing_is_folded_unless_named():
    """Without --gpu-check no profile value is calibrated (the built-ins hold published data and datasheets)."""
    from costmodel.profile import profile_from_dict

    for name, tree in B.build_all().items():
        p = profile_from_dict(tree, name)
        assert not [k for k, v in p.provenance.items() if v.tier == "calibrated"], name
