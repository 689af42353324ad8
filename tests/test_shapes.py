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
    one_line_error("whatif", "--model", _config(tmp_path, ["intermediate_size"], "a"),
                   needle="config.json has no 'intermediate_size'")
    m = _config(tmp_path, ["num_key_value_heads", "head_dim"], "b")
    assert main(["whatif", "--model", m, "--no-band"]) == 0
    out = capsys.readouterr().out
    assert "no num_key_value_heads; taken as Hugging Face does: num_key_value_heads = num_attention_heads = 32" in out
    assert "no head_dim; taken as Hugging Face does: head_dim = hidden_size / num_attention_heads = 128" in out
