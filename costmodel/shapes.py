"""Model shapes from HF config.json (llama/qwen/mistral-style dense; MoE fields recognised)."""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import Path
from typing import Any
from collections.abc import Mapping

from .errors import TpcostError
from .io import read_json

DTYPES = ("bf16", "fp8", "fp8-dynamic", "fp32")  # the model's dtype modes (ops.DTYPE_MODES); fp32: CPU runs


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The dimensions of a decoder-only transformer that the cost model needs."""

    name: str
    hidden: int
    intermediate: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_layers: int
    vocab: int
    tied_embeddings: bool
    # MoE (0 experts = dense MLP)
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0
    quantization: str | None = None  # e.g. "fp8" from quantization_config.quant_method
    defaults: tuple[str, ...] = ()  # fields config.json left out, filled as Hugging Face fills them (said in output)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def check_tp(self, tp: int) -> None:
        """Raise TpcostError unless this model can be split `tp` ways as vLLM shards it."""
        if not isinstance(tp, int) or tp < 1:
            raise TpcostError(f"--tp must be an integer >= 1, got {tp}")
        if self.hidden % tp:
            raise TpcostError(f"hidden size {self.hidden} of {self.name} is not divisible by tp={tp}")
        if self.num_heads % tp:
            raise TpcostError(f"num_attention_heads {self.num_heads} of {self.name} is not divisible by tp={tp}")
        inter = self.moe_intermediate if self.is_moe else self.intermediate
        if inter % tp:
            raise TpcostError(f"intermediate size {inter} of {self.name} is not divisible by tp={tp}")
        if self.num_kv_heads % tp and tp % self.num_kv_heads:
            raise TpcostError(f"num_key_value_heads {self.num_kv_heads} of {self.name} neither divides nor is divisible by tp={tp}")

    def kv_heads_per_rank(self, tp: int) -> int:
        """vLLM replicates KV heads when tp > num_kv_heads: max(1, kv/tp) per rank."""
        return max(1, self.num_kv_heads // tp)


# Largest value accepted per field: beyond these a config.json is a mistake (today's largest models are
# 1-2 orders of magnitude below), and the model's arrays would not fit in memory.
MAX_FIELD = {"hidden_size": 2**17, "num_attention_heads": 2**12, "num_key_value_heads": 2**12, "head_dim": 2**12,
             "intermediate_size": 2**20, "moe_intermediate_size": 2**20, "num_hidden_layers": 2**12,
             "vocab_size": 2**23, "experts": 2**14, "num_experts_per_tok": 2**14}
# DeepSeek-V2/V3 and Kimi-K2 (MLA attention, dense first layers, shared experts): not modelled yet.
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
              "first_k_dense_replace", "n_shared_experts")


def _int(cfg: Mapping[str, Any], key: str, where: str, default=None) -> int:
    v = cfg.get(key, default)
    if v is None:
        raise TpcostError(f"{where}: config.json has no {key!r}")
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise TpcostError(f"{where}: {key} must be a positive integer, got {v!r}")
    cap = MAX_FIELD.get(key)
    if cap is not None and v > cap:
        raise TpcostError(f"{where}: {key} = {v} is above {cap}, which no model this tool knows comes near")
    return v


def shape_from_config(cfg: Mapping[str, Any], name: str, where: str | None = None) -> ModelShape:
    """Build a ModelShape from a parsed HF config (nested `text_config` is used when present)."""
    where = where or name
    if not isinstance(cfg, dict):
        raise TpcostError(f"{where}: config.json must hold a JSON object")
    from .vllm_tables import refuse_forward

    refuse_forward(cfg, where)
    if isinstance(cfg.get("text_config"), dict):
        outer_q = cfg.get("quantization_config")
        cfg = {**cfg["text_config"], **({"quantization_config": outer_q} if outer_q else {})}
    mla = [f for f in MLA_FIELDS if cfg.get(f) not in (None, 0)]
    if mla:
        raise TpcostError(f"{where}: DeepSeek-style fields are not modelled yet ({', '.join(mla)}); "
                          "refusing rather than treating it as a dense llama")
    hidden = _int(cfg, "hidden_size", where)
    heads = _int(cfg, "num_attention_heads", where)
    defaults = []
    if cfg.get("num_key_value_heads") is None:  # transformers' Llama/Qwen2/Mistral configs: None -> attention heads
        defaults.append(f"num_key_value_heads = num_attention_heads = {heads} (no grouped-query attention)")
    kv = _int(cfg, "num_key_value_heads", where, default=heads)
    if kv > heads or heads % kv:
        raise TpcostError(f"{where}: num_key_value_heads {kv} must divide num_attention_heads {heads}")
    if cfg.get("head_dim") is None:
        if hidden % heads:
            raise TpcostError(f"{where}: head_dim is not given and hidden_size {hidden} / num_attention_heads "
                              f"{heads} is not an integer")
        head_dim = hidden // heads
        defaults.append(f"head_dim = hidden_size / num_attention_heads = {head_dim}")
    else:
        head_dim = _int(cfg, "head_dim", where)
    n_exp = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0
    if isinstance(n_exp, bool) or not isinstance(n_exp, int) or n_exp < 0 or n_exp > MAX_FIELD["experts"]:
        raise TpcostError(f"{where}: number of experts must be an integer in [0, {MAX_FIELD['experts']}], got {n_exp!r}")
    top_k = cfg.get("num_experts_per_tok", cfg.get("num_selected_experts"))
    if n_exp:
        top_k = 2 if top_k is None else top_k
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= n_exp:
            raise TpcostError(f"{where}: num_experts_per_tok must be an integer in [1, {n_exp}] "
                              f"(the expert count), got {top_k!r}")
    moe_inter = cfg.get("moe_intermediate_size") or (cfg.get("intermediate_size") if n_exp else 0) or 0
    if n_exp:
        moe_inter = _int({"moe_intermediate_size": moe_inter}, "moe_intermediate_size", where)
    if not n_exp and cfg.get("intermediate_size") is None:
        raise TpcostError(f"{where}: config.json has no 'intermediate_size' (the dense MLP's width), and no experts")
    inter = cfg.get("intermediate_size") or moe_inter
    q = cfg.get("quantization_config")
    quant = q.get("quant_method") if isinstance(q, dict) else None
    return ModelShape(
        name=name,
        hidden=hidden,
        intermediate=_int({"intermediate_size": inter}, "intermediate_size", where),
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        num_layers=_int(cfg, "num_hidden_layers", where),
        vocab=_int(cfg, "vocab_size", where),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        num_experts=n_exp,
        experts_per_token=int(top_k or 0) if n_exp else 0,
        moe_intermediate=int(moe_inter) if n_exp else 0,
        quantization=quant,
        defaults=tuple(defaults),
    )


def builtin_model_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("costmodel.models").iterdir() if p.name.endswith(".json"))


def builtin_model_config(name: str) -> dict:
    return json.loads(resources.files("costmodel.models").joinpath(f"{name}.json").read_text())


def load_model_config(name_or_path: str) -> tuple[dict, str, str]:
    """(config, model name, where it came from) of a built-in model, a config.json path, or a directory holding one."""
    if name_or_path in builtin_model_names():
        return builtin_model_config(name_or_path), name_or_path, name_or_path
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise TpcostError(f"unknown model {name_or_path!r}; built-in: {', '.join(builtin_model_names())} "
                          "(or a path to a config.json)")
    cfg = read_json(path, "config.json")
    if not isinstance(cfg, dict):
        raise TpcostError(f"{path}: config.json must hold a JSON object at its top level, got {type(cfg).__name__}")
    name = cfg.get("_name_or_path")
    if not (isinstance(name, str) and name):  # the directory of a config.json, else the file's own stem
        stem = path.name.removesuffix(".json").removesuffix(".config")
        name = (path.parent.name or str(path)) if path.name == "config.json" else stem
    return cfg, name, str(path)


def load_model(name_or_path: str) -> ModelShape:
    """A built-in model by name, a config.json path, or a directory holding config.json."""
    cfg, name, where = load_model_config(name_or_path)
    return shape_from_config(cfg, name, where)


def check_dtype(dtype: str) -> str:
    if dtype not in DTYPES:
        raise TpcostError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    return dtype
