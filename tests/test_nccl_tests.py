"""calibrate --from-nccl-tests: nccl-tests logs (both table layouts) become a profile whatif uses;
no torch."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from costmodel import load_profile
from integration.cli import main

FIX = Path(__file__).parent / "fixtures" / "nccl-tests"


def test_logs_in_both_layouts_become_a_calibrated_profile(tmp_path, capsys):
    out = tmp_path / "node.toml"
    assert (
        main(
            [
                "calibrate",
                "--from-nccl-tests",
                str(FIX / "all_reduce_perf_new.txt"),
                str(FIX / "reduce_scatter_perf_old.txt"),
                "--from",
                "h100-sxm",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert (
        "collectives.nccl_all_reduce.tp4" in text and "collectives.nccl_reduce_scatter.tp4" in text
    )
    p, base = load_profile(str(out)), load_profile("h100-sxm")
    ar = p.provenance["collectives.nccl_all_reduce.tp4.bus_bw_bytes_per_s"]
    assert (
        ar.tier == "calibrated"
        and "NVIDIA H100 80GB HBM3, 4 ranks on 1 host(s), NCCL 2.21.5" in ar.source
    )
    # the fixtures were written from t = α + factor·S/busBW (±2 %): all-reduce α 12 us, busBW 315
    # GB/s (factor 2·3/4); reduce-scatter α 13 us, busBW 170 GB/s (factor 3/4); the fit must recover
    # them
    assert p.value("collectives.nccl_all_reduce.tp4.bus_bw_bytes_per_s") == pytest.approx(
        315e9, rel=0.05
    )
    assert p.value("collectives.nccl_all_reduce.tp4.latency_s") == pytest.approx(12e-6, rel=0.1)
    rs = p.provenance["collectives.nccl_reduce_scatter.tp4.bus_bw_bytes_per_s"]
    assert (
        p.value("collectives.nccl_reduce_scatter.tp4.bus_bw_bytes_per_s")
        == pytest.approx(170e9, rel=0.05)
        and "version not printed" in rs.source
    )
    assert p.value("collectives.nccl_reduce_scatter.tp4.latency_s") == pytest.approx(13e-6, rel=0.1)
    # everything else keeps its prior and says so
    assert p.value("gemm.max_efficiency") == base.value("gemm.max_efficiency")
    assert (
        p.provenance["gemm.max_efficiency"].source == base.provenance["gemm.max_efficiency"].source
    )
    assert "gemm" in p.notes["calibration.not_measured_kept_prior"]
    assert main(["whatif", "--gpu", str(out), "--no-band", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpu"] == "h100-sxm-nccl-tests"


def test_works_without_torch(tmp_path):
    code = (
        "import sys; sys.modules['torch'] = None; from integration.cli import main; "
        "sys.exit(main(['calibrate', '--from-nccl-tests', "
        f"{str(FIX / 'all_reduce_perf_new.txt')!r}, "
        f"'--from', 'h100-sxm', '--out', {str(tmp_path / 'x.toml')!r}]))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    "text,needle",
    [
        ("hello world\n", "not nccl-tests output"),
        (
            "# nThread 1 nGpus 1 minBytes 8 maxBytes 64 step: 2(factor)\n#       size count type "
            "redop root time\n 8 2 float sum -1 5.0 0 0 0\n",
            "Rank",
        ),
        (
            (FIX / "all_reduce_perf_new.txt")
            .read_text()
            .replace("      float", "      float  x", 0)
            .replace("        -1", "        -1 abc", 1),
            "not a number",
        ),
        (
            (FIX / "all_reduce_perf_new.txt").read_text().replace(" float ", " qfloat ", 1),
            "unknown data type",
        ),
        (
            (FIX / "all_reduce_perf_new.txt")
            .read_text()
            .replace("262144       65536", "262000       65536", 1),
            "match no all-reduce",
        ),
    ],
)
def test_malformed_or_foreign_logs_one_line(tmp_path, one_line_error, text, needle):
    f = tmp_path / "log.txt"
    f.write_text(text)
    one_line_error(
        "calibrate",
        "--from-nccl-tests",
        str(f),
        "--from",
        "h100-sxm",
        "--out",
        str(tmp_path / "o.toml"),
        needle=needle,
    )
    assert not (tmp_path / "o.toml").exists()


def _log(name):
    return (FIX / name).read_text()


def _calib(tmp_path, *texts, gpu="h100-sxm"):
    files = []
    for i, t in enumerate(texts):
        f = tmp_path / f"log{i}.txt"
        f.write_text(t)
        files.append(str(f))
    return [
        "calibrate",
        "--from-nccl-tests",
        *files,
        "--from",
        gpu,
        "--out",
        str(tmp_path / "out.toml"),
    ]


def test_nccl_tests_failed_or_thin_or_foreign_logs(tmp_path, one_line_error):
    good = _log("all_reduce_perf_new.txt")
    rows = [ln for ln in good.splitlines() if ln.strip() and ln.split()[0].isdigit()]
    # the in-place #wrong of one size: 7
    wrong = good.replace(rows[3], rows[3][: rows[3].rindex("0")] + "7")
    one_line_error(*_calib(tmp_path, wrong), needle="nccl-tests counted 7 wrong values")
    failed = good.replace("# Out of bounds values : 0 OK", "# Out of bounds values : 3 FAILED")
    one_line_error(*_calib(tmp_path, failed), needle="nccl-tests marked this run failed")
    one_size = good.replace("\n".join(rows), "\n".join([rows[5]] * 6))
    one_line_error(*_calib(tmp_path, one_size), needle="of 1 message size(s)")
    one_line_error(
        *_calib(tmp_path, good, good), needle="give one log per collective and rank count"
    )
    fast = good
    for r in rows:  # every time / 10: a busBW 10x the H100's link
        t = r.split()[5]
        fast = fast.replace(r, r.replace(t, f"{float(t) / 10:.2f}", 1))
    one_line_error(*_calib(tmp_path, fast), needle="above 1.5x h100-sxm's link")
    two_hosts = good.replace(
        "Rank  2 Group  0 Pid  41023 on   gpu-node-07",
        "Rank  2 Group  0 Pid  41023 on   gpu-node-08",
    )
    one_line_error(*_calib(tmp_path, two_hosts), needle="run on 2 hosts, outside one NVLink domain")


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather"])
def test_a_measured_collective_replaces_the_prior_at_every_logged_size(tmp_path, capsys, op):
    """Issue 47: after calibrate --from-nccl-tests on a synthetic 8-GPU log (20 us, 100 GB/s busBW),
    `collective` predicts NCCL within 5 % at every logged size from 1 MiB to 256 MiB: the prior's
    faster regime curves of the same collective at that TP (another machine's) are dropped, not left
    to win the minimum."""
    from costmodel import formulas as F

    assert main(_calib(tmp_path, synthetic_log(op))) == 0
    said = capsys.readouterr().out
    prior = load_profile("h100-sxm")
    if any(8 in prior.collective_tps(f"nccl_{op}{r}") for r in ("_small", "_mid")):
        assert "regime curves of the measured collectives dropped" in said
    assert (
        main(["collective", "--gpu", str(tmp_path / "out.toml"), "--tp", "8", "--op", op, "--json"])
        == 0
    )
    rows = json.loads(capsys.readouterr().out)["rows"]
    fac = float(F.bus_bw_factor(op, 8))
    got = {int(r["size_bytes"]): r["t_nccl_s"] for r in rows}
    checked = 0
    for s in (2**p for p in range(20, 29)):
        if s in got:
            assert got[s] == pytest.approx(20e-6 + fac * s / 100e9, rel=0.05), s
            checked += 1
    assert checked >= 5


def test_whatif_moves_with_a_measured_all_reduce(tmp_path, capsys):
    """t_tp at 16384 tokens follows the log's slower all-reduce (the prior's curves would hide
    it)."""
    assert main(_calib(tmp_path, synthetic_log("all_reduce"))) == 0
    capsys.readouterr()
    argv = [
        "whatif",
        "--tp",
        "8",
        "--tokens",
        "16384",
        "--max-num-batched-tokens",
        "16384",
        "--no-band",
        "--json",
        "--vllm-version",
        "0.31",
    ]
    assert main([*argv, "--gpu", "h100-sxm"]) == 0
    before = json.loads(capsys.readouterr().out)
    assert main([*argv, "--gpu", str(tmp_path / "out.toml")]) == 0
    after = json.loads(capsys.readouterr().out)
    t0, t1 = before["rows"][0]["t_tp_s"], after["rows"][0]["t_tp_s"]
    assert t1 > t0 * 1.5  # 2 x 80 all-reduces of 16384 x 8192 x 2 B at 100 GB/s busBW: ~0.8 s more


def test_a_log_of_another_gpu_is_refused_unless_intended(tmp_path, capsys, one_line_error):
    one_line_error(
        *_calib(tmp_path, synthetic_log("all_gather"), gpu="b200"), needle="measured on NVIDIA H100"
    )
    assert not (tmp_path / "out.toml").exists()
    assert (
        main([*_calib(tmp_path, synthetic_log("all_gather"), gpu="b200"), "--allow-other-gpu"]) == 0
    )
    capsys.readouterr()
    p = load_profile(str(tmp_path / "out.toml"))
    assert (
        "measured on NVIDIA H100 80GB HBM3"
        in p.provenance["collectives.nccl_all_gather.tp8.bus_bw_bytes_per_s"].source
    )
    one_line_error(
        "calibrate",
        "--allow-other-gpu",
        "--out",
        str(tmp_path / "x.toml"),
        needle="--allow-other-gpu",
    )
    (
        tmp_path / "out.toml"
    ).unlink()  # the log is the H100's own: the flag would change nothing (issue 61)
    one_line_error(
        *_calib(tmp_path, synthetic_log("all_gather"), gpu="h100-sxm"),
        "--allow-other-gpu",
        needle="--allow-other-gpu: no effect",
    )


def test_collective_log_gives_the_verdict_first_and_draws_it(tmp_path, capsys, one_line_error):
    """Issue 47 item 3: one verdict line (median and worst |pred/meas - 1|) before a table with a
    unit in every column; --json carries it; --plot draws measured against predicted busBW (a PNG),
    only with --log, never over a file without --force."""
    log = tmp_path / "ar.log"
    log.write_text(synthetic_log("all_reduce", lat_s=30e-6, busbw=200e9))
    assert main(["collective", "--gpu", "h100-sxm", "--log", str(log)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("verdict: the profile's NCCL all_reduce is off the log by a median")
    assert "size [B]" in lines[2] and "measured [us]" in lines[2] and "(us)" not in lines[2]
    assert main(["collective", "--gpu", "h100-sxm", "--log", str(log), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    errs = [abs(r["nccl_pred_over_measured"] - 1) for r in d["rows"]]
    assert d["verdict"]["worst_abs_rel_error"] == pytest.approx(max(errs))
    assert d["verdict"]["median_abs_rel_error"] == pytest.approx(sorted(errs)[len(errs) // 2])
    png = tmp_path / "c.png"
    assert main(["collective", "--gpu", "h100-sxm", "--log", str(log), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    one_line_error(
        "collective", "--gpu", "h100-sxm", "--log", str(log), "--plot", str(png), needle="--force"
    )
    one_line_error(
        "collective",
        "--gpu",
        "h100-sxm",
        "--tp",
        "8",
        "--op",
        "all_reduce",
        "--plot",
        str(png),
        needle="give --log FILE too",
    )
    one_line_error(
        "collective",
        "--gpu",
        "h100-sxm",
        "--tp",
        "8",
        "--op",
        "all_reduce",
        "--force",
        needle="give --plot too",
    )


def test_a_degraded_log_warns_and_the_graph_mode_is_recorded(tmp_path, capsys):
    """A busBW below half the prior's says the other curves on those links stay uncalibrated;
    nccl-tests' `graph: 0` is written into the source (an eager latency holds a launch that graph
    replay does not pay)."""
    assert main(_calib(tmp_path, synthetic_log("all_reduce", busbw=40e9))) == 0
    out = capsys.readouterr().out
    assert (
        "warning:" in out
        and "below half the prior's" in out
        and "keep their (uncalibrated) priors" in out
    )
    src = (
        load_profile(str(tmp_path / "out.toml"))
        .provenance["collectives.nccl_all_reduce.tp8.latency_s"]
        .source
    )
    assert "timed eagerly (graph: 0)" in src
    assert "run nccl-tests with -G 1 (CUDA graphs) to calibrate vLLM's graph regime" in out
    (tmp_path / "out.toml").unlink()
    # the prior's 476 GB/s: not half
    assert main(_calib(tmp_path, synthetic_log("all_reduce", busbw=400e9))) == 0
    assert "warning:" not in capsys.readouterr().out


def render_log(op: str, rows, gpu: str, ranks: int = 8) -> str:
    """An nccl-tests log (root layout) of `op` whose size S takes time t, for (S, t) in `rows`."""
    from costmodel import formulas as F

    fac = float(F.bus_bw_factor(op, ranks))
    out = [
        f"# nThread 1 nGpus {ranks} minBytes {rows[0][0]} maxBytes {rows[-1][0]} step: 2(factor) "
        "warmup iters: 5 "
        "iters: 20 agg iters: 1 validation: 1 graph: 0",
        "#",
    ]
    out += [
        f"#  Rank  {r} Group  0 Pid  {1000 + r} on      node1 device  {r} [0x{r:02x}] {gpu}"
        for r in range(ranks)
    ]
    out += [
        "#",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     "
        "time   algbw "
        "  busbw #wrong",
    ]
    for s, t in rows:
        count = s // 2 if op == "all_reduce" else s // 2 // ranks
        cell = f"{t * 1e6:10.2f} {s / t / 1e9:7.2f} {fac * s / t / 1e9:7.2f}      0"
        out.append(
            f"{s:>12d} {count:>12d}  bfloat16 {'none' if op == 'all_gather' else 'sum':>7s}      "
            f"-1  {cell}  {cell}"
        )
    return "\n".join(out + ["# Out of bounds values : 0 OK", ""])


def synthetic_log(
    op: str,
    gpu: str = "NVIDIA H100 80GB HBM3",
    ranks: int = 8,
    lat_s: float = 20e-6,
    busbw: float = 100e9,
    sizes=tuple(2**p for p in range(20, 29)),
) -> str:
    """render_log of a log whose every size takes exactly lat_s + factor(op)·S/busbw (nccl-tests'
    busBW convention)."""
    from costmodel import formulas as F

    fac = float(F.bus_bw_factor(op, ranks))
    return render_log(op, [(s, lat_s + fac * s / busbw) for s in sizes], gpu, ranks)


def test_a_released_sweep_rendered_as_a_log_calibrates_its_regimes(tmp_path, capsys):
    """Issue 47 item 7: MLENG_AR_8xH200_NCCL2307_NCCLTESTS (nccl-tests all_reduce_perf on 8 x H200,
    32 KiB - 16 GiB, data/reference) as an nccl-tests log: its sizes identify NCCL's regimes, so
    calibrate fits the three-curve envelope (the prior's are another fit's) and `collective --log`
    on the result puts the NCCL prediction within 5 % median and 15 % worst of the log."""
    import csv
    import re

    from costmodel import formulas as F

    with open(
        Path(__file__).resolve().parents[1] / "data" / "reference" / "components.csv", newline=""
    ) as f:
        rel = [
            r for r in csv.DictReader(f) if r["source_id"] == "MLENG_AR_8xH200_NCCL2307_NCCLTESTS"
        ]
    fac = float(F.bus_bw_factor("all_reduce", 8))
    rows = sorted((int(re.match(r"(\d+)", r["M_or_tokens"]).group(1)), 0.0) for r in rel)
    bus = {
        int(re.match(r"(\d+)", r["M_or_tokens"]).group(1)): float(r["baseline_value"]) * 1e9
        for r in rel
    }
    rows = [(s, fac * s / bus[s]) for s, _ in rows]
    log = tmp_path / "h200.log"
    log.write_text(render_log("all_reduce", rows, "NVIDIA H200"))
    assert (
        main(
            [
                "calibrate",
                "--from-nccl-tests",
                str(log),
                "--from",
                "h200-sxm",
                "--out",
                str(tmp_path / "o.toml"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "identify NCCL's protocol regimes" in out
    p = load_profile(str(tmp_path / "o.toml"))
    for r in ("_small", "_mid", ""):
        assert p.provenance[f"collectives.nccl_all_reduce{r}.tp8.latency_s"].tier == "calibrated"
    assert main(["collective", "--gpu", str(tmp_path / "o.toml"), "--log", str(log), "--json"]) == 0
    v = json.loads(capsys.readouterr().out)["verdict"]
    assert v["median_abs_rel_error"] < 0.05 and v["worst_abs_rel_error"] < 0.15, v


def test_the_calibrated_profile_speaks_the_public_schema(tmp_path, capsys):
    """Issue 47 item 4: the written profile groups values by source in `_`-prefixed tables named
    after the values they hold (docs/profiles.md), no internal counter such as `._s1`; it loads back
    to the same values."""
    import re
    import tomllib

    assert main(_calib(tmp_path, synthetic_log("all_reduce"))) == 0
    capsys.readouterr()
    text = (tmp_path / "out.toml").read_text()
    assert not re.search(r"\._s\d+\]", text)
    groups = 0

    def walk(t):
        nonlocal groups
        for k, v in t.items():
            if isinstance(v, dict):
                if k.startswith("_"):
                    values = sorted(x for x, y in v.items() if isinstance(y, float))
                    assert k == "_" + "_".join(values), (k, values)
                    groups += 1
                walk(v)

    walk(tomllib.loads(text))
    assert groups > 0
    p, base = load_profile(str(tmp_path / "out.toml")), load_profile("h100-sxm")
    assert p.value("gemm.max_efficiency") == base.value("gemm.max_efficiency")


def test_fuzz_classes_of_the_log_reader(tmp_path, one_line_error):
    """Issue 50, nccl-tests logs: a size printed with a unit ('1M') was dropped silently; a time of
    1e-300 us was taken (busBW inf); an 8-rank log from 2 hosts was compared with a one-node curve
    without a word. Each is refused in one line, by calibrate and by collective --log alike."""
    good = synthetic_log("all_reduce")
    lines = good.splitlines()
    i = next(j for j, ln in enumerate(lines) if ln.strip().startswith("1048576"))
    cases = {
        "suffix": "\n".join(
            lines[:i] + [lines[i].replace("     1048576", "          1M", 1)] + lines[i + 1 :]
        ),
        "tiny": "\n".join(
            lines[:i] + [lines[i].replace(lines[i].split()[5], "1e-300", 1)] + lines[i + 1 :]
        ),
        "hosts": good.replace("on      node1 device  4", "on      node2 device  4"),
    }
    needles = {
        "suffix": "printed with a unit",
        "tiny": "no collective call is that fast",
        "hosts": "ranks run on 2 hosts, outside one NVLink domain",
    }
    for name, text in cases.items():
        p = tmp_path / f"{name}.log"
        p.write_text(text)
        one_line_error(
            "calibrate",
            "--from-nccl-tests",
            str(p),
            "--from",
            "h100-sxm",
            "--out",
            str(tmp_path / f"{name}.toml"),
            needle=needles[name],
        )
        one_line_error("collective", "--gpu", "h100-sxm", "--log", str(p), needle=needles[name])


def test_between_measured_sizes_the_measurement_is_interpolated(tmp_path, capsys):
    """Issue 47 item 1: a log that no alpha-beta line or regime envelope follows (its busBW dips at
    16-32 MiB, as a protocol switch or contention would make it) is the profile's curve at every
    logged size, exactly; between two logged sizes it is interpolated in log size and log time;
    above the largest the last point grows along the fitted curve (never falling); below the
    smallest the fitted curve stands. The points travel in the written profile."""
    import numpy as np

    from costmodel import formulas as F
    from costmodel import ops

    fac = float(F.bus_bw_factor("all_reduce", 8))
    sizes = [2**p for p in range(20, 29)]
    bw = {s: (60e9 if 2**24 <= s <= 2**25 else 100e9) for s in sizes}
    rows = [(s, 20e-6 + fac * s / bw[s]) for s in sizes]
    assert main(_calib(tmp_path, render_log("all_reduce", rows, "NVIDIA H100 80GB HBM3"))) == 0
    said = capsys.readouterr().out
    assert "[measured.nccl_all_reduce.tp8]: the log's 9 points" in said
    prof = load_profile(str(tmp_path / "out.toml"))
    m = prof.measured["nccl_all_reduce"][8]
    assert list(m.msg_bytes) == sizes and "as logged" in m.source
    hw = ops.Hw(prof, "bf16")
    t_log = np.array([t for _, t in rows])
    # nccl-tests prints times to 0.01 us: the logged value, as the profile holds it
    assert np.allclose(
        ops.t_nccl_all_reduce_s(hw, 8, np.array(sizes, dtype=float)), m.time_s, rtol=1e-12
    )
    assert np.allclose(m.time_s, t_log, rtol=1e-3)
    # between 16 and 32 MiB: the geometric mean of the neighbours' times
    mid = np.sqrt(sizes[4] * sizes[5])
    assert float(ops.t_nccl_all_reduce_s(hw, 8, np.array([mid]))[0]) == pytest.approx(
        np.sqrt(m.time_s[4] * m.time_s[5]), rel=1e-9
    )
    fitted = lambda S: F.t_all_reduce_regimes_s(S, *ops.nccl_curves(hw, "nccl_all_reduce", 8), 8)  # noqa: E731
    big = np.array([2.0**29, 2.0**30])
    above = ops.t_nccl_all_reduce_s(hw, 8, big)
    assert np.allclose(above, m.time_s[-1] + fitted(big) - fitted(np.array([2.0**28])))
    assert np.all(np.diff(np.concatenate([[m.time_s[-1]], above])) > 0)
    small = np.array([2.0**10, 2.0**15])
    assert np.allclose(ops.t_nccl_all_reduce_s(hw, 8, small), fitted(small))
    # the fitted envelope alone misses the dip; the interpolated measurement does not
    assert abs(float(fitted(np.array([2.0**25]))[0]) / m.time_s[5] - 1) > 0.05
    # the `collective` command reads the same curve
    assert (
        main(
            [
                "collective",
                "--gpu",
                str(tmp_path / "out.toml"),
                "--tp",
                "8",
                "--op",
                "all_reduce",
                "--json",
            ]
        )
        == 0
    )
    got = {int(r["size_bytes"]): r["t_nccl_s"] for r in json.loads(capsys.readouterr().out)["rows"]}
    for s, t in zip(m.msg_bytes, m.time_s):
        if int(s) in got:
            assert got[int(s)] == pytest.approx(t, rel=1e-9)


def test_set_on_a_measured_collective_replaces_the_points(tmp_path, capsys):
    """A --set on the measured collective (or on the link) is a what-if on it: the measured points
    go, and the answer at a logged size moves; on another collective they stay."""
    import numpy as np

    from costmodel import ops
    from costmodel.profile import parse_set, with_overrides

    assert main(_calib(tmp_path, synthetic_log("all_reduce"))) == 0
    capsys.readouterr()
    prof = load_profile(str(tmp_path / "out.toml"))
    S = np.array([2.0**24])
    t0 = float(ops.t_nccl_all_reduce_s(ops.Hw(prof, "bf16"), 8, S)[0])
    for key, gone in (
        ("collectives.nccl_all_reduce.tp8.bus_bw_bytes_per_s=200e9", True),
        ("interconnect.link_bw_bytes_per_s=900e9", True),
        ("collectives.nccl_all_gather.tp8.bus_bw_bytes_per_s=200e9", False),
    ):
        p = with_overrides(prof, parse_set([key]))
        assert (8 not in p.measured.get("nccl_all_reduce", {})) is gone, key
        t = float(ops.t_nccl_all_reduce_s(ops.Hw(p, "bf16"), 8, S)[0])
        assert (t != pytest.approx(t0, rel=1e-6)) is gone, key


def test_set_on_measured_points_or_an_unknown_key_says_so(one_line_error):
    """A --set key that names no quantity says "unknown quantity" (it said "no plausible range
    defined"); one that names a measured point says what a --set on that collective does instead."""
    one_line_error("whatif", "--set", "foo.bar=1", needle="unknown quantity 'foo.bar'")
    one_line_error(
        "whatif",
        "--set",
        "measured.nccl_all_reduce.tp8.time_s=1",
        needle="measured points are a calibration's log, not a quantity",
    )


@pytest.mark.parametrize(
    "table,needle",
    [
        (
            "[measured.nccl_all_reduce.tp8]\nmsg_bytes = [1, 2]\ntime_s = [1e-5, 2e-5]\nsource = "
            '"x"\n',
            "3 to 4096 points",
        ),
        (
            "[measured.nccl_all_reduce.tp8]\nmsg_bytes = [1, 3, 2]\ntime_s = [1e-5, 2e-5, "
            '3e-5]\nsource = "x"\n',
            "increasing order",
        ),
        (
            "[measured.nccl_all_reduce.tp8]\nmsg_bytes = [1, 2, 3]\ntime_s = [1e-5, -2e-5, "
            '3e-5]\nsource = "x"\n',
            "time_s",
        ),
        (
            "[measured.nccl_all_reduce.tp8]\nmsg_bytes = [1, 2, 3]\ntime_s = [1e-5, 2e-5, 3e-5]\n",
            "tp<W> table of",
        ),
        (
            "[measured.custom_ar_1stage.tp8]\nmsg_bytes = [1, 2, 3]\ntime_s = [1e-5, 2e-5, "
            '3e-5]\nsource = "x"\n',
            "a measured curve is one of",
        ),
        (
            "[measured.nccl_all_reduce.tp3]\nmsg_bytes = [1, 2, 3]\ntime_s = [1e-5, 2e-5, "
            '3e-5]\nsource = "x"\n',
            "has no fitted curve",
        ),
        (
            '[measured.nccl_all_reduce.tp8]\nmsg_bytes = ["a", 2, 3]\ntime_s = [1e-5, 2e-5, '
            '3e-5]\nsource = "x"\n',
            "msg_bytes",
        ),
        # no point beats the link at line rate (x2 for an in-switch all-reduce): 1 GB in 1 us
        (
            "[measured.nccl_all_reduce.tp8]\nmsg_bytes = [1e3, 1e6, 1e9]\ntime_s = [1e-5, 2e-5, "
            '1e-6]\nsource = "x"\n',
            "beyond the link's 450 GB/s line rate (x2 for an in-switch all-reduce)",
        ),
        (
            "[measured.nccl_all_gather.tp8]\nmsg_bytes = [1, 2, 99999999999999999999]\ntime_s = "
            '[1e-5, 2e-5, 3e-5]\nsource = "x"\n',
            "no transfer beats its link",
        ),
        (
            "[measured.nccl_reduce_scatter.tp8]\nmsg_bytes = [1, 2, 3]\ntime_s = [1e-300, 2e-300, "
            '3e-300]\nsource = "x"\n',
            "no transfer beats its link",
        ),
        (
            "[measured.nccl_all_reduce.tp8]\nmsg_bytes = [1, 2, 3]\ntime_s = [1e-5, 2e-5, 3e5]\n"
            'source = "x"\n',
            "no collective of a sweep runs over 100 s",
        ),
    ],
)
def test_bad_measured_tables_one_line(tmp_path, one_line_error, table, needle):
    from importlib import resources

    text = resources.files("costmodel.profiles").joinpath("h100-sxm.toml").read_text()
    p = tmp_path / "bad.toml"
    p.write_text(text + "\n" + table)
    one_line_error("whatif", "--gpu", str(p), "--no-band", needle=needle)


def test_measured_points_hold_numbers_and_more_bytes_never_take_less_time(
    tmp_path, capsys, one_line_error
):
    """Issue 61: a measured curve's sizes and times are numbers (a string or a boolean is one line),
    and a curve whose time dips as the size grows (noise) never makes a collective cheaper with more
    bytes, at the lower edge of the measured range included."""
    import re

    import numpy as np

    from costmodel.ops import Hw, t_nccl_all_gather_s

    sizes = tuple(2**p for p in range(20, 29))
    times = [20e-6 + 8 * s / 100e9 for s in sizes]
    times[1] = times[0] * 0.5  # a dip: the second size timed faster than the first
    log = render_log("all_gather", list(zip(sizes, times, strict=True)), "NVIDIA H100 80GB HBM3", 8)
    assert main(_calib(tmp_path, log)) == 0
    capsys.readouterr()
    out = tmp_path / "out.toml"
    prof = load_profile(str(out))
    S = np.geomspace(1e3, 2**29, 400)
    t = t_nccl_all_gather_s(Hw(prof, "bf16"), 8, S)
    assert np.all(np.diff(t) >= -1e-15)
    text = out.read_text()
    for bad in ('"1048576"', "true"):
        m = re.search(r"msg_bytes = \[\s*([0-9_.e+]+)", text)
        (tmp_path / "bad.toml").write_text(text[: m.start(1)] + bad + text[m.end(1) :])
        one_line_error(
            "whatif", "--gpu", str(tmp_path / "bad.toml"), "--no-band", needle="hold numbers"
        )


def test_a_tp8_calibration_says_it_holds_at_tp8_only(tmp_path, capsys):
    """Issue 61 item 10: a profile calibrated from a TP 8 log answers at TP 4 as the built-in does,
    and says so in one note (text and JSON); at TP 8 no such note."""
    assert main(_calib(tmp_path, synthetic_log("all_gather"))) == 0
    capsys.readouterr()
    prof = str(tmp_path / "out.toml")
    assert (
        main(["whatif", "--gpu", prof, "--tp", "4", "--no-band", "--json", "--tokens", "64"]) == 0
    )
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any("calibrated at TP 8 only" in n for n in notes)
    assert (
        main(["whatif", "--gpu", prof, "--tp", "8", "--no-band", "--json", "--tokens", "64"]) == 0
    )
    assert not any("calibrated at TP" in n for n in json.loads(capsys.readouterr().out)["notes"])
    assert main(["whatif", "--gpu", prof, "--tp", "4", "--no-band", "--tokens", "64"]) == 0
    assert "note: " in capsys.readouterr().out
