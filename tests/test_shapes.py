"""costmodel.shapes: a config.json with fields missing is one clear line."""

import json
from pathlib import Path

from integration.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _config(tmp_path, drop, name):
    cfg = json.loads((ROOT / "costmodel" / "models" / "llama-3.1-8b.json").read_text())
    for k in drop:
        cfg.pop(k, None)
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def test_config_fields_missing(tmp_path, one_line_error, capsys):
    one_line_error(
        "whatif",
        "--model",
        _config(tmp_path, ["intermediate_size"], "a"),
        needle="config.json has no 'intermediate_size'",
    )
    m = _config(tmp_path, ["num_key_value_heads", "head_dim"], "b")
    assert main(["whatif", "--model", m, "--no-band"]) == 0
    out = capsys.readouterr().out
    assert (
        "no num_key_value_heads; taken as Hugging Face does: num_key_value_heads = "
        "num_attention_heads = 32" in out
    )
    assert (
        "no head_dim; taken as Hugging Face does: head_dim = hidden_size / num_attention_heads = "
        "128" in out
    )


def _hf_cache(tmp_path, monkeypatch, rev="abc123def4567890", ref=True, **change):
    """A Hugging Face hub cache holding meta-llama/Llama-3.1-8B-Instruct at snapshot `rev`, its
    config changed."""
    cfg = json.loads((ROOT / "costmodel" / "models" / "llama-3.1-8b.json").read_text())
    cfg.pop("_name_or_path")
    cfg.update(change)
    repo = tmp_path / "hub" / "models--meta-llama--Llama-3.1-8B-Instruct"
    (repo / "snapshots" / rev).mkdir(parents=True)
    (repo / "snapshots" / rev / "config.json").write_text(json.dumps(cfg))
    if ref:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(rev + "\n")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    return repo


def test_hub_id_reads_the_cached_snapshot(tmp_path, monkeypatch, capsys):
    from costmodel.shapes import load_model, load_model_config

    _hf_cache(tmp_path, monkeypatch, intermediate_size=28672)
    cfg, name, where = load_model_config("meta-llama/Llama-3.1-8B-Instruct")
    assert name == "meta-llama/Llama-3.1-8B-Instruct" and "snapshot abc123def456" in where
    # the snapshot, not the built-in
    assert load_model("meta-llama/Llama-3.1-8B-Instruct").intermediate == 28672
    assert load_model("llama-3.1-8b").intermediate == 14336

    def row(model):
        assert main(["whatif", "--model", model, "--no-band", "--json", "--tokens", "64"]) == 0
        d = json.loads(capsys.readouterr().out)
        return d["model"], d["rows"][0]["t_tp_s"]

    hub, builtin = row("meta-llama/Llama-3.1-8B-Instruct"), row("llama-3.1-8b")
    # a wider MLP costs more
    assert hub[0] == "meta-llama/Llama-3.1-8B-Instruct" and hub[1] > builtin[1]


def test_hub_id_without_refs_takes_the_one_snapshot(tmp_path, monkeypatch):
    from costmodel.shapes import load_model_config

    _hf_cache(tmp_path, monkeypatch, ref=False)
    assert "snapshot abc123def456" in load_model_config("meta-llama/Llama-3.1-8B-Instruct")[2]


def test_hub_id_bad_cases(tmp_path, monkeypatch, one_line_error):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    one_line_error(
        "whatif",
        "--model",
        "meta-llama/Llama-3.1-8B-Instruct",
        needle="not in the local Hugging Face cache",
    )
    err = one_line_error("whatif", "--model", "meta-llama/Llama-3.1-8B-Instruct")
    assert "the built-in 'llama-3.1-8b' is that model" in err
    one_line_error("whatif", "--model", "someorg/no-such-model", needle="built-in: ")
    repo = _hf_cache(tmp_path, monkeypatch)
    (repo / "refs" / "main").write_text("../../etc")
    one_line_error(
        "whatif", "--model", "meta-llama/Llama-3.1-8B-Instruct", needle="not a snapshot revision"
    )
    (repo / "refs" / "main").write_text("0000missing")
    one_line_error(
        "whatif",
        "--model",
        "meta-llama/Llama-3.1-8B-Instruct",
        needle="not in the local Hugging Face cache",
    )
    (tmp_path / "nocfg").mkdir()
    one_line_error(
        "whatif", "--model", str(tmp_path / "nocfg"), needle="the directory holds no config.json"
    )


def test_hub_id_two_snapshots_no_ref(tmp_path, monkeypatch, one_line_error):
    repo = _hf_cache(tmp_path, monkeypatch, ref=False)
    (repo / "snapshots" / "other").mkdir()
    (repo / "snapshots" / "other" / "config.json").write_text("{}")
    one_line_error("whatif", "--model", "meta-llama/Llama-3.1-8B-Instruct", needle="2 snapshots")
