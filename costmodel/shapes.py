"""Model shapes from HF config.json: dense, MoE, and the kernel families (docs/model.md §13)."""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import Path
from typing import Any
from collections.abc import Mapping

import fnmatch
import re

from .errors import TpcostError
from .io import match_builtin, read_json
from .vllm_tables import (
    FLASHINFER_MOE_EP_PREFIX,
    MEGA_MOE_NVFP4,
    NATIVE_MEGA_MOE,
    SWITCHES,
    Parallel,
    Vllm,
    shared_expert_can_shard,
)

# the model's dtype modes (ops.DTYPE_MODES); fp32: CPU runs
DTYPES = (
    "bf16",
    "fp8",
    "fp8-dynamic",
    "fp32",
)


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The dimensions of a decoder-only transformer that the cost model needs (§13)."""

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
    defaults: tuple[
        str, ...
    ] = ()  # fields config.json left out, filled as Hugging Face fills them (said in output)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def check_tp(self, tp: int) -> None:
        """Raise TpcostError unless this model can be split `tp` ways as vLLM shards it (§13)."""
        if not isinstance(tp, int) or tp < 1:
            raise TpcostError(f"--tp must be an integer >= 1, got {tp}")
        if self.hidden % tp:
            raise TpcostError(
                f"hidden size {self.hidden} of {self.name} is not divisible by tp={tp}"
            )
        if self.num_heads % tp:
            raise TpcostError(
                f"num_attention_heads {self.num_heads} of {self.name} is not divisible by tp={tp}"
            )
        inter = self.moe_intermediate if self.is_moe else self.intermediate
        if inter % tp:
            raise TpcostError(
                f"intermediate size {inter} of {self.name} is not divisible by tp={tp}"
            )
        if self.num_kv_heads % tp and tp % self.num_kv_heads:
            raise TpcostError(
                f"num_key_value_heads {self.num_kv_heads} of {self.name} neither divides nor is "
                f"divisible by tp={tp}"
            )

    def kv_heads_per_rank(self, tp: int) -> int:
        """vLLM replicates KV heads when tp > num_kv_heads: max(1, kv/tp) per rank (§5)."""
        return max(1, self.num_kv_heads // tp)


# Largest value accepted per field: beyond these a config.json is a mistake (today's largest models
# are 1-2 orders of magnitude below), and the model's arrays would not fit in memory.
MAX_FIELD = {
    "hidden_size": 2**17,
    "num_attention_heads": 2**12,
    "num_key_value_heads": 2**12,
    "head_dim": 2**12,
    "intermediate_size": 2**20,
    "moe_intermediate_size": 2**20,
    "num_hidden_layers": 2**12,
    "vocab_size": 2**23,
    "experts": 2**14,
    "num_experts_per_tok": 2**14,
}
# DeepSeek-V2/V3 and Kimi-K2 (MLA attention, dense first layers, shared experts): not modelled yet.
MLA_FIELDS = (
    "q_lora_rank",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "first_k_dense_replace",
    "n_shared_experts",
)


def _int(cfg: Mapping[str, Any], key: str, where: str, default=None) -> int:
    v = cfg.get(key, default)
    if v is None:
        raise TpcostError(f"{where}: config.json has no {key!r}")
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise TpcostError(f"{where}: {key} must be a positive integer, got {v!r}")
    cap = MAX_FIELD.get(key)
    if cap is not None and v > cap:
        raise TpcostError(
            f"{where}: {key} = {v} is above {cap}, which no model this tool knows comes near"
        )
    return v


def shape_from_config(cfg: Mapping[str, Any], name: str, where: str | None = None) -> ModelShape:
    """Build a ModelShape from a parsed HF config (its `text_config` where nested; §13)."""
    where = where or name
    if not isinstance(cfg, dict):
        raise TpcostError(f"{where}: config.json must hold a JSON object")
    refuse_forward(cfg, where)
    if isinstance(cfg.get("text_config"), dict):
        outer_q = cfg.get("quantization_config")
        cfg = {**cfg["text_config"], **({"quantization_config": outer_q} if outer_q else {})}
    mla = [f for f in MLA_FIELDS if cfg.get(f) not in (None, 0)]
    if mla:
        raise TpcostError(
            f"{where}: MLA / DeepSeek-style fields ({', '.join(mla)}) are priced by the EP step, "
            "not "
            "the TP path: run `tpcost ep --enable-expert-parallel --model ...`"
        )
    hidden = _int(cfg, "hidden_size", where)
    heads = _int(cfg, "num_attention_heads", where)
    defaults = []
    # transformers' Llama/Qwen2/Mistral configs: None -> attention heads
    if cfg.get("num_key_value_heads") is None:
        defaults.append(
            f"num_key_value_heads = num_attention_heads = {heads} (no grouped-query attention)"
        )
    kv = _int(cfg, "num_key_value_heads", where, default=heads)
    if kv > heads or heads % kv:
        raise TpcostError(
            f"{where}: num_key_value_heads {kv} must divide num_attention_heads {heads}"
        )
    if cfg.get("head_dim") is None:
        if hidden % heads:
            raise TpcostError(
                f"{where}: head_dim is not given and hidden_size {hidden} / num_attention_heads "
                f"{heads} is not an integer"
            )
        head_dim = hidden // heads
        defaults.append(f"head_dim = hidden_size / num_attention_heads = {head_dim}")
    else:
        head_dim = _int(cfg, "head_dim", where)
    n_exp = (
        cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0
    )
    if (
        isinstance(n_exp, bool)
        or not isinstance(n_exp, int)
        or n_exp < 0
        or n_exp > MAX_FIELD["experts"]
    ):
        raise TpcostError(
            f"{where}: number of experts must be an integer in [0, {MAX_FIELD['experts']}], got "
            f"{n_exp!r}"
        )
    top_k = cfg.get("num_experts_per_tok", cfg.get("num_selected_experts"))
    if n_exp:
        top_k = 2 if top_k is None else top_k
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= n_exp:
            raise TpcostError(
                f"{where}: num_experts_per_tok must be an integer in [1, {n_exp}] "
                f"(the expert count), got {top_k!r}"
            )
    moe_inter = (
        cfg.get("moe_intermediate_size") or (cfg.get("intermediate_size") if n_exp else 0) or 0
    )
    if n_exp:
        moe_inter = _int({"moe_intermediate_size": moe_inter}, "moe_intermediate_size", where)
    if not n_exp and cfg.get("intermediate_size") is None:
        raise TpcostError(
            f"{where}: config.json has no 'intermediate_size' (the dense MLP's width), and no "
            "experts"
        )
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


def all_builtin_model_names() -> list[str]:
    """Every built-in config: the TP path's and the EP step's (MLA models, `tpcost ep`; §13)."""
    return sorted(
        p.name[:-5]
        for p in resources.files("costmodel.models").iterdir()
        if p.name.endswith(".json")
    )


def builtin_model_names() -> list[str]:
    """The built-in models the TP path prices: all but the MLA ones, which `ep` prices (§13)."""
    return [n for n in all_builtin_model_names() if not builtin_model_config(n).get("kv_lora_rank")]


def builtin_ep_model_names() -> list[str]:
    """The built-in MoE models the EP step prices (§13)."""
    return [
        n
        for n in all_builtin_model_names()
        if builtin_model_config(n).get("n_routed_experts")
        or builtin_model_config(n).get("num_experts")
        or builtin_model_config(n).get("num_local_experts")
    ]


def builtin_model_config(name: str) -> dict:
    return json.loads(resources.files("costmodel.models").joinpath(f"{name}.json").read_text())


def load_model_config(name_or_path: str) -> tuple[dict, str, str]:
    """(config, name, origin) of a built-in model, a config.json path or its directory (§13)."""
    if name_or_path in all_builtin_model_names():
        return builtin_model_config(name_or_path), name_or_path, name_or_path
    path = Path(name_or_path)
    if not path.exists():
        match = match_builtin(name_or_path, all_builtin_model_names(), "model")
        if match is not None:
            return builtin_model_config(match), match, match
    # a hub id
    if not path.exists() and HUB_ID.fullmatch(name_or_path) and not name_or_path.endswith(".json"):
        path, rev = hf_cache_config(name_or_path)
        cfg = read_json(path, "config.json")
        if not isinstance(cfg, dict):
            raise TpcostError(f"{path}: config.json must hold a JSON object at its top level")
        return cfg, name_or_path, f"{name_or_path} (Hugging Face cache, snapshot {rev[:12]})"
    if path.is_dir():
        if not (path / "config.json").exists():
            raise TpcostError(f"model {name_or_path!r}: the directory holds no config.json")
        path = path / "config.json"
    if not path.exists():
        # meant as a path
        if "/" in name_or_path or "\\" in name_or_path or name_or_path.endswith(".json"):
            raise TpcostError(
                f"model {name_or_path!r}: no such file or directory (the public configs that ship: "
                "data/reference/models/*.config.json)"
            )
        raise TpcostError(
            f"unknown model {name_or_path!r}; built-in: {', '.join(all_builtin_model_names())} "
            "(or a path to a config.json)"
        )
    cfg = read_json(path, "config.json")
    if not isinstance(cfg, dict):
        raise TpcostError(
            f"{path}: config.json must hold a JSON object at its top level, got "
            f"{type(cfg).__name__}"
        )
    name = cfg.get("_name_or_path")
    # the directory of a config.json, else the file's own stem
    if not (isinstance(name, str) and name):
        stem = path.name.removesuffix(".json").removesuffix(".config")
        name = (path.parent.name or str(path)) if path.name == "config.json" else stem
    return cfg, name, str(path)


# org/name, as vLLM's --model takes it
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache (§13)."""
    # ~/.cache/huggingface/hub, by the hub's own conventions.
    import os

    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    return Path(home) / "hub"


def hf_cache_config(hub_id: str) -> tuple[Path, str]:
    """(config.json of `hub_id` in the local cache, its snapshot revision), offline (§13)."""
    # models--org--name, refs/main's revision (else the one snapshot there); one line naming what to
    # do where it is not cached.
    cache = hf_hub_cache()
    repo = cache / ("models--" + hub_id.replace("/", "--"))
    rev = ""
    ref = repo / "refs" / "main"
    if ref.is_file():
        rev = ref.read_text(encoding="utf-8", errors="replace").strip()
        if not re.fullmatch(r"[\w.-]+", rev) or rev in (".", ".."):
            raise TpcostError(f"{ref}: not a snapshot revision ({rev[:40]!r})")
    elif (repo / "snapshots").is_dir():
        snaps = sorted(
            p.name for p in (repo / "snapshots").iterdir() if (p / "config.json").exists()
        )
        if len(snaps) > 1:
            raise TpcostError(
                f"model {hub_id!r}: {len(snaps)} snapshots in {repo / 'snapshots'} and no "
                "refs/main; "
                "give the path of the one meant"
            )
        rev = snaps[0] if snaps else ""
    cfg = repo / "snapshots" / rev / "config.json"
    if not rev or not cfg.is_file():
        same = [
            n
            for n in all_builtin_model_names()
            if str(builtin_model_config(n).get("_name_or_path", "")).casefold() == hub_id.casefold()
        ]
        hint = (
            f"the built-in {same[0]!r} is that model"
            if same
            else f"built-in: {', '.join(all_builtin_model_names())}"
        )
        raise TpcostError(
            f"model {hub_id!r}: not in the local Hugging Face cache ({cache}); {hint}; or give the "
            "path of its config.json (tpcost reads the cache offline, never the network)"
        )
    return cfg, rev


def load_model(name_or_path: str) -> ModelShape:
    """A built-in model by name, a config.json path, or a directory holding config.json (§13)."""
    cfg, name, where = load_model_config(name_or_path)
    return shape_from_config(cfg, name, where)


def check_dtype(dtype: str) -> str:
    if dtype not in DTYPES:
        raise TpcostError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    return dtype


# ---------------------------------------------------------------- where vLLM's fused kernel runs: a
# model's call sites Kimi-K3 / Kimi-Linear and DeepSeek-V4.1, read from their config.json as vLLM's
# model code builds them (where in that code: costmodel.vllm_tables.KERNEL_SITES_CITE). A call-site
# reader, not a forward: whatif refuses these models (refuse_forward) and vllm-config --kernel-op
# answers their switch.
KIMI_ARCHS = ("KimiK3ForConditionalGeneration", "KimiLinearForCausalLM")
DEEPSEEK_ARCHS = ("DeepseekV41ForCausalLM",)
MINIMAX_ARCHS = ("MiniMaxM3SparseForConditionalGeneration", "MiniMaxM3SparseForCausalLM")
MINIMAX_TYPES = ("minimax_m3_vl", "minimax_m3")
MUSE_ARCHS = ("MuseSparkForCausalLM", "MuseSparkForConditionalGeneration")
MUSE_TYPES = ("muse_spark",)


@dataclasses.dataclass(frozen=True)
class CallSite:
    """One GEMM that ends in the kernel's collective, and how often it runs per forward (§15)."""

    name: str
    n: int  # output width (the hidden size)
    k: int  # reduction depth per rank
    calls_per_forward: int
    # "bf16" | "mxfp8": what can_run takes; None: can_run refuses (see `refused`)
    weights: str | None
    # followed by vLLM's residual-add RMSNorm: FlashInfer's AR+norm pattern in the unfused arm
    norm_after: bool
    # why vLLM keeps the unfused path at this site (None: the kernel binds)
    refused: str | None = None

    def shape_text(self) -> str:
        return f"n {self.n}, k {self.k}"

    def to_json(self) -> dict:
        return {
            "site": self.name,
            "n": self.n,
            "k": self.k,
            "calls_per_forward": self.calls_per_forward,
        }


@dataclasses.dataclass(frozen=True)
class ArTail:
    """What a model's one-shot all-reduce kernel also does, and its unfused arm (§4b)."""

    hidden: int
    # permuted expert rows per token this rank reduces (top_k under TP, top_k / EP under EP)
    routed_rows: float
    shared_row: (
        bool  # a shared-expert row joins the sum (the unfused arm adds it in its own kernel)
    )
    # the all-reduce feeds a residual-add RMSNorm (the unfused arm: FlashInfer's AR+norm, vLLM's
    # rule)
    norm: bool
    # the fused kernel writes the next GEMM's MXFP8 input; the unfused arm quantises after the norm
    mxfp8_out: bool
    fused_kernels: int = 1  # launches of the fused path (a publish kernel and its PDL consumer: 2)


@dataclasses.dataclass(frozen=True)
class TailSite:
    """One all-reduce whose kernel also runs a MoE finalize, and how often per forward (§4b)."""

    name: str
    tail: ArTail
    calls_per_forward: int
    weights: str | None = "bf16"  # the decision prices it (None: refused, see `refused`)
    refused: str | None = None
    # the TP group spans hosts of one NVLink domain (vLLM's unfused dispatch changes)
    cross_host: bool = False

    def shape_text(self) -> str:
        t = self.tail
        return (
            f"H {t.hidden}, {t.routed_rows:g} routed row(s) per token"
            + (" + a shared row" if t.shared_row else "")
            + (", MXFP8 out" if t.mxfp8_out else "")
        )

    def to_json(self) -> dict:
        t = self.tail
        return {
            "site": self.name,
            "hidden": t.hidden,
            "routed_rows": t.routed_rows,
            "shared_row": t.shared_row,
            "norm": t.norm,
            "mxfp8_out": t.mxfp8_out,
            "fused_kernels": t.fused_kernels,
            "calls_per_forward": self.calls_per_forward,
        }


@dataclasses.dataclass(frozen=True)
class SpCondition:
    """When a family's model code turns model-level SP on (§15)."""

    # PP 1 (where it asks) ∧ expert parallel ∧ TP > 1 ∧ (a MegaMoE backend ∨, where it counts,
    # DP > 1).

    # the MoE backends that turn it on ("prefix*": every backend starting so)
    backends: tuple[str, ...]
    needs_pp1: bool
    dp_enables: bool  # DP > 1 turns it on with any MoE backend
    where: str  # the function in vLLM's model code

    def on(self, par: Parallel) -> bool:
        """Model-level SP in this setup (§15)."""
        mega = any(
            par.moe_backend.startswith(b[:-1]) if b.endswith("*") else par.moe_backend == b
            for b in self.backends
        )
        return (
            (par.pipeline_parallel_size == 1 or not self.needs_pp1)
            and par.enable_expert_parallel
            and par.tp > 1
            and (mega or (self.dp_enables and par.data_parallel_size > 1))
        )

    def text(self) -> str:
        """The condition in vLLM's flag names (§15)."""
        mega = " or ".join(self.backends)
        if self.dp_enables:
            return (
                f"PP 1, --enable-expert-parallel, TP > 1, and --moe-backend {mega} or "
                "--data-parallel-size > 1"
            )
        return (
            f"--moe-backend {mega}, "
            + ("PP 1, " if self.needs_pp1 else "")
            + "--enable-expert-parallel and TP > 1"
        )


# model-level SP per family, as its model code decides it (vLLM 0.33-0.34); another family reads as
# Kimi-K3
MODEL_LEVEL_SP = {
    "kimi_k3": SpCondition(
        (NATIVE_MEGA_MOE,), True, True, "kimi_k3 model.py (vllm_tables.MODEL_LEVEL_SP_CITE)"
    ),
    "deepseek_v41": SpCondition(
        (NATIVE_MEGA_MOE, FLASHINFER_MOE_EP_PREFIX + "*"),
        True,
        True,
        "deepseek_v41 model.py (the FlashInfer MoE-EP megakernels too)",
    ),
    "minimax_m3": SpCondition(
        (NATIVE_MEGA_MOE,), False, False, "minimax_m3 _use_sequence_parallel (no DP or PP term)"
    ),
    "muse_spark": SpCondition(
        (NATIVE_MEGA_MOE,), True, False, "muse_spark is_sequence_parallel_enabled (no DP term)"
    ),
}


@dataclasses.dataclass(frozen=True)
class KernelModel:
    """What the kernel's decision needs from a config.json of a family that binds it (§15)."""

    # The call sites; vLLM's gates that decide which run are costmodel.vllm_tables'.

    name: str
    family: str  # "kimi_k3" | "deepseek_v41"
    hidden: int
    num_layers: int
    model_dtype: str  # the config's dtype (vLLM's --dtype auto): the kernel needs bfloat16
    _cfg: Mapping[str, Any] = dataclasses.field(repr=False)

    def model_level_sp(self, par: Parallel) -> bool:
        """vLLM's model-level SP for this family and setup (MODEL_LEVEL_SP; §15)."""
        return self._sp_condition().on(par)

    def mode(self, par: Parallel) -> str | None:
        """The one mode a worker binds: "gemm_rs" under model-level SP, else "gemm_ar" (§15)."""
        # Kimi-K3; DeepSeek-V4.1 has no GEMM-AR site: None.
        if self.model_level_sp(par):
            return "gemm_rs"
        # DeepSeek-V4.1, MiniMax-M3: GEMM-RS only
        return "gemm_ar" if self.family == "kimi_k3" else None

    def switch_problem(self, op: str, par: Parallel) -> str | None:
        """Why `op`'s switch has no effect for this model and setup (None: it decides; §15)."""
        sw = SWITCHES[op].env
        if self.family == "muse_spark":
            return (
                f"{sw} has no effect: it switches gemm_rs_ar, which Muse Spark does not call; its "
                "own GEMM-RS "
                "and sp_all_gather_matmul have no switch, and vllm-config reports their gates "
                "without --kernel-op"
            )
        if self.model_dtype != "bfloat16":
            return (
                f"{sw} has no effect: the model dtype is {self.model_dtype}, and the kernel "
                "needs bfloat16"
            )
        mode = self.mode(par)
        if mode != op:
            # no SP flag given: the family has no GEMM-AR site at all
            if op == "gemm_ar" and mode is None:
                return (
                    f"{sw} has no effect: {self.name} has no GEMM-AR call site; its kernel runs as "
                    "GEMM-RS, "
                    f"only under model-level SP ({self.sp_text()})"
                )
            if op == "gemm_ar":
                return (
                    f"{sw} has no effect: with model-level SP ({self.sp_text()}) the worker binds "
                    "the kernel "
                    "to GEMM-RS (VLLM_ENABLE_GEMM_RS)"
                )
            return (
                f"{sw} has no effect: {self.name} runs GEMM-RS only under model-level SP "
                f"({self.sp_text()}), "
                "which this parallel setup does not give"
            )
        return None

    def sp_text(self) -> str:
        """When model-level SP is on for this family, in vLLM's flag names (§15)."""
        return self._sp_condition().text()

    def _sp_condition(self) -> SpCondition:
        return MODEL_LEVEL_SP.get(self.family, MODEL_LEVEL_SP["kimi_k3"])

    def nvfp4(self) -> bool:
        """The checkpoint is ModelOpt NVFP4 (vLLM's ModelOptNvFp4Config; §15)."""
        # quantization_config quant_algo NVFP4.
        q = self._cfg.get("quantization_config")
        return isinstance(q, dict) and str(q.get("quant_algo") or "").upper() == "NVFP4"

    def sp_floor_tokens(self, par: Parallel, vllm: Vllm) -> int:
        """Muse Spark: the fewest tokens of a step that shards the stream, else 0 (§15)."""
        # the fewest tokens of a step that shards the stream, max(tp, threshold + 1), the threshold
        # 128 (TP 4) / 256 (TP 8) with NVFP4 MegaMoE at DP = PP = 1, else 0
        # (is_sequence_parallel_active, get_trtllm_token_threshold: `vllm`'s record, whose per-TP
        # table names the TPs it covers).
        floor = next((g for g in vllm.release.model_gates if g.op == "sp_floor"), None)
        thr = 0
        if (
            floor is not None
            and self.nvfp4()
            and par.moe_backend == NATIVE_MEGA_MOE
            and par.tp in floor.value
            and par.data_parallel_size == 1
            and par.pipeline_parallel_size == 1
        ):
            thr = int(floor.value[par.tp])
        return max(par.tp, thr + 1)

    def moe_quant_algo(self) -> Any:
        """The routed experts' format as the config names it (None: bf16; §15)."""
        # quantization_config moe_quant_algo.
        q = self._cfg.get("quantization_config")
        return q.get("moe_quant_algo") if isinstance(q, dict) else None

    def qkv_weights(self) -> str | None:
        """The format of the attention's qkv_proj weights ("bf16", "mxfp8"; None: other; §15)."""
        return self._weights("model.layers.1.self_attn.qkv_proj")[0]

    def vllm_refuses(self, par: Parallel) -> str | None:
        """Why vLLM refuses this checkpoint in this setup at init (None: it builds; §15)."""
        # MiniMax-M3's MegaMoE, which model-level SP needs, wants NVFP4 routed experts; Muse Spark's
        # MegaMoE wants expert parallel.
        if (
            self.family == "muse_spark"
            and par.moe_backend == NATIVE_MEGA_MOE
            and not par.enable_expert_parallel
        ):
            return (
                "vLLM refuses this: Muse Spark MegaMoE requires expert parallel "
                "(--enable-expert-parallel; "
                "NotImplementedError at init)"
            )
        if self.family != "minimax_m3" or par.moe_backend != NATIVE_MEGA_MOE:
            return None
        algo = self.moe_quant_algo()
        if algo != "NVFP4":
            return f"vLLM refuses this: {MEGA_MOE_NVFP4} (this checkpoint: moe_quant_algo {algo!r})"
        if not par.enable_expert_parallel:
            return f"vLLM refuses this: {MEGA_MOE_NVFP4} (--enable-expert-parallel is not given)"
        return None

    def call_sites(self, op: str, par: Parallel, vllm: Vllm) -> list[CallSite]:
        """The sites where `op` replaces a GEMM + collective in one forward (§15)."""
        # The mode must be `op`'s.
        tp = par.tp
        c = self._cfg
        sites: list[
            tuple[str, str, int, int, int, bool]
        ] = []  # (name, module path, n, k total, calls, norm)
        h = self.hidden
        if self.family == "muse_spark":
            heads, kv = (
                _pos(c, "num_attention_heads", self.name),
                _pos(c, "num_key_value_heads", self.name),
            )
            hd = _pos(c, "head_dim", self.name)
            if (
                op == "ag_gemm"
                # the fused qkv(+o-gate) projection: N = (q + k + v [+ gate]) heads x head_dim, K =
                # H
            ):
                gate = c.get("use_attn_o_gate", True) is not False
                weights, why = self._weights("model.layers.0.self_attn.qkv_proj")
                if weights not in (None, "bf16"):
                    weights, why = (
                        None,
                        f"{weights} weights: sp_all_gather_matmul needs an unquantised bf16 weight",
                    )
                return [
                    CallSite(
                        "qkv_proj (fused q, k, v, o-gate)" if gate else "qkv_proj",
                        _split_n(((2 if gate else 1) * heads + 2 * kv) * hd, tp, self.name),
                        h,
                        self.num_layers,
                        weights,
                        False,
                        why,
                    )
                ]
            sites.append(
                ("o_proj", "model.layers.0.self_attn.o_proj", h, heads * hd, self.num_layers, False)
            )
        # under SP: o_proj in every layer, the dense layers' down_proj
        elif self.family == "minimax_m3":
            k_tot = _pos(c, "num_attention_heads", self.name) * _pos(c, "head_dim", self.name)
            sites.append(
                ("o_proj", "model.layers.0.self_attn.o_proj", h, k_tot, self.num_layers, False)
            )
            dense = self.num_layers - self.num_moe_layers()
            if dense:
                sites.append(
                    (
                        "down_proj (dense MLP)",
                        "model.layers.0.mlp.down_proj",
                        h,
                        _pos(c, "dense_intermediate_size", self.name),
                        dense,
                        False,
                    )
                )
        elif self.family == "deepseek_v41":
            k_tot = _pos(c, "o_groups", self.name) * _pos(c, "o_lora_rank", self.name)
            sites.append(("wo_b", "model.layers.0.attn.wo_b", h, k_tot, self.num_layers, False))
        else:
            ar = op == "gemm_ar"
            lac = c.get("linear_attn_config") or {}
            kda = set(lac.get("kda_layers") or ())
            # is_kda_layer: (layer_idx + 1) in kda
            n_kda = sum(1 for i in range(self.num_layers) if i + 1 in kda)
            n_mla = self.num_layers - n_kda
            if n_mla:
                k_tot = _pos(c, "num_attention_heads", self.name) * _pos(c, "v_head_dim", self.name)
                sites.append(
                    ("o_proj (MLA)", "model.layers.0.self_attn.o_proj", h, k_tot, n_mla, ar)
                )
            # Kimi-Linear's own KDA does not bind the kernel
            if n_kda and lac.get("use_full_rank_gate", False):
                k_tot = _pos(lac, "num_heads", self.name) * _pos(lac, "head_dim", self.name)
                sites.append(
                    ("o_proj (KDA)", "model.layers.1.self_attn.o_proj", h, k_tot, n_kda, ar)
                )
            dense = self.num_layers - self.num_moe_layers()
            shard = par.shard_sp_shared_expert
            # the dense MLP: all-reduces, or reduce-scatters when sharded under SP
            if dense and (ar or shard):
                sites.append(
                    (
                        "down_proj (dense MLP)",
                        "model.layers.0.mlp.down_proj",
                        h,
                        _pos(c, "intermediate_size", self.name),
                        dense,
                        ar,
                    )
                )
            n_shared = _count(c, "num_shared_experts", self.name)
            if (
                not ar
                and shard
                and n_shared
                and self.num_moe_layers()
                and shared_expert_can_shard(vllm, par)
            ):
                sites.append(
                    (
                        "shared_experts.down_proj",
                        "model.layers.1.block_sparse_moe.shared_experts.down_proj",
                        h,
                        _pos(c, "moe_intermediate_size", self.name) * int(n_shared),
                        self.num_moe_layers(),
                        False,
                    )
                )
        out = []
        for name, path, n, k_tot, calls, norm in sites:
            if k_tot % tp:
                raise TpcostError(f"{self.name}: {name}'s K = {k_tot} is not divisible by tp={tp}")
            k = k_tot // tp
            weights, why = self._weights(path)
            if weights is not None:
                align = 64 if weights == "bf16" else 128
                if k % align:
                    weights, why = (
                        None,
                        f"K = {k} per rank is not a multiple of {align} (can_run, {weights} "
                        "weights)",
                    )
            out.append(CallSite(name, n, k, calls, weights, norm, why))
        return out

    def check_tp(self, tp: int) -> None:
        """Refuse a TP vLLM refuses for this model: its attention (and KDA) heads split (§15)."""
        c = self._cfg
        for where, cfg, key in (
            ("", c, "num_attention_heads"),
            ("linear_attn_config.", c.get("linear_attn_config"), "num_heads"),
        ):
            heads = cfg.get(key) if isinstance(cfg, dict) else None
            if isinstance(cfg, dict) and heads is not None and _pos(cfg, key, self.name) % tp:
                raise TpcostError(
                    f"{self.name}: {where}{key} = {heads} is not divisible by tp={tp} (vLLM "
                    "refuses "
                    "such a TP: each rank takes whole heads)"
                )

    def ar_norm_units_per_forward(self) -> int:
        """All-reduces followed by a residual-add RMSNorm in one forward without SP (§4)."""
        # FlashInfer's fusion pattern: every layer's o_proj and its MLP or MoE output (assumed: the
        # MoE's all-reduce reaches the next norm).
        return 2 * self.num_layers

    def finalize_sites(self, par: Parallel) -> list[TailSite]:
        """The MoE layers whose finalize a fused all-reduce can take (§4b)."""
        # The MoE layers whose finalize a fused all-reduce can take (docs/model.md §4b):
        # MiniMax-M3's, each with a successor (the last layer keeps its own; every rank reduces all
        # top_k rows of its TP shard, plus the shared row, into MXFP8 for the next qkv_proj); Muse
        # Spark's under EP over the TP group (top_k / EP rows a rank, no norm, bf16 out).
        c = self._cfg
        flags = self.moe_layer_flags()
        k = _pos(c, "num_experts_per_tok", self.name)
        if self.family == "minimax_m3":
            shared = bool(
                _count(c, "n_shared_experts", self.name)
                or _count(c, "num_shared_experts", self.name)
            )
            calls = sum(flags[:-1])
            return (
                [
                    TailSite(
                        "MoE finalize -> next input norm",
                        ArTail(self.hidden, float(k), shared, True, True, 2),
                        calls,
                        cross_host=par.tp_spans_nodes(),
                    )
                ]
                if calls
                else []
            )
        if self.family == "muse_spark":
            ep = par.tp * par.data_parallel_size if par.enable_expert_parallel else 1
            return (
                [
                    TailSite(
                        "post-expert finalize",
                        ArTail(self.hidden, k / ep, False, False, False, 1),
                        sum(flags),
                        cross_host=par.tp_spans_nodes(),
                    )
                ]
                if any(flags)
                else []
            )
        return []

    def num_moe_layers(self) -> int:
        """The MoE layers of one forward (moe_layer_flags; §15)."""
        return sum(self.moe_layer_flags())

    def moe_layer_flags(self) -> list[bool]:
        """Per layer, whether it is a MoE layer, as the family's model code decides (§15)."""
        # layer_idx >= first_k_dense_replace and layer_idx % moe_layer_freq == 0
        # (KimiDecoderLayer.is_moe_layer); MiniMax-M3: mlp_layer_types "sparse", or the old hub
        # schema's moe_layer_freq list (1: MoE).
        c = self._cfg
        if self.family == "minimax_m3":
            kinds, freq_list = c.get("mlp_layer_types"), c.get("moe_layer_freq")
            if isinstance(kinds, list) and not all(isinstance(k, str) for k in kinds):
                raise TpcostError(
                    f"{self.name}: config.json's mlp_layer_types must be a list of strings"
                )
            if isinstance(freq_list, list) and not all(
                isinstance(x, (int, bool)) for x in freq_list
            ):
                raise TpcostError(
                    f"{self.name}: config.json's moe_layer_freq list must hold 0 / 1 per layer"
                )
            per_layer = (
                [k == "sparse" for k in kinds]
                if isinstance(kinds, list)
                else [bool(x) for x in freq_list]
                if isinstance(freq_list, list)
                else None
            )
            if per_layer is None or len(per_layer) < self.num_layers:
                raise TpcostError(
                    f"{self.name}: config.json needs mlp_layer_types or a moe_layer_freq list of "
                    f"{self.num_layers} entries (MiniMax-M3's dense and MoE layers)"
                )
            return per_layer[: self.num_layers]
        if not (_count(c, "num_experts", self.name) or _count(c, "num_local_experts", self.name)):
            return [False] * self.num_layers
        first = _count(c, "first_k_dense_replace", self.name)
        freq = _count(c, "moe_layer_freq", self.name, lo=1)
        return [i >= first and i % freq == 0 for i in range(self.num_layers)]

    def _weights(self, module: str) -> tuple[str | None, str | None]:
        """The site's weight format as can_run sees it: bf16 (unquantised, or named by the config's
        ignore list), mxfp8, or None with the reason."""
        q = self._cfg.get("quantization_config")
        if not isinstance(q, dict):
            return "bf16", None
        ignore = [x for key in QUANT_IGNORE_KEYS for x in (q.get(key) or ())]
        for pat in ignore:
            if not isinstance(pat, str):
                continue
            if pat.startswith("re:"):
                try:
                    if re.match(pat[3:], module):
                        return "bf16", None
                except re.error as e:
                    raise TpcostError(
                        f"{self.name}: quantization_config ignore pattern {pat!r} is not a regular "
                        f"expression ({e})"
                    ) from None
            # ModelOpt's exclude_modules: fnmatch
            elif (
                module == pat
                or module.endswith("." + pat)
                or pat in module.split(".")
                or ("*" in pat and fnmatch.fnmatchcase(module, pat))
            ):
                return "bf16", None
        fmt = " ".join(
            str(q.get(x) or "") for x in ("quant_method", "format", "quant_algo")
        ).lower()
        if "mxfp8" in fmt:
            return "mxfp8", None
        return None, (
            f"{fmt.strip() or 'quantised'} weights: can_run takes unquantised bf16 or FlashInfer "
            "MXFP8 "
            "linears only"
        )


# unquantised modules
QUANT_IGNORE_KEYS = (
    "ignore",
    "ignored_layers",
    "modules_to_not_convert",
    "exclude_modules",
)
# any other shape field of a kernel model's config.json (o_lora_rank, o_groups, ...)
KERNEL_FIELD_CAP = 2**20


def _pos(cfg: Mapping[str, Any], key: str, where: str) -> int:
    """A positive integer field of a kernel model's config.json, within MAX_FIELD's cap (else
    KERNEL_FIELD_CAP)."""
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise TpcostError(f"{where}: config.json needs a positive integer {key!r}, got {v!r}")
    cap = MAX_FIELD.get(key, KERNEL_FIELD_CAP)
    if v > cap:
        raise TpcostError(
            f"{where}: {key} = {v} is above {cap}, which no model this tool knows comes near"
        )
    return v


def _count(cfg: Mapping[str, Any], key: str, where: str, lo: int = 0) -> int:
    """An optional integer count of a kernel model's config.json (absent or null: lo), in [lo,
    KERNEL_FIELD_CAP]."""
    v = cfg.get(key)
    if v is None:
        return lo
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= KERNEL_FIELD_CAP:
        raise TpcostError(
            f"{where}: config.json's {key!r} must be an integer in [{lo}, {KERNEL_FIELD_CAP}], got "
            f"{v!r}"
        )
    return v


def _split_n(n_total: int, tp: int, where: str) -> int:
    if n_total % tp:
        raise TpcostError(f"{where}: the projection's N = {n_total} is not divisible by tp={tp}")
    return n_total // tp


def kernel_family(cfg: Mapping[str, Any]) -> str | None:
    """The family whose vLLM model code gates a fused GEMM+collective, else None (§15)."""
    # 'kimi_k3', 'deepseek_v41', 'minimax_m3' or 'muse_spark' (gemm_rs_ar, Muse Spark's own
    # GEMM-RS and sp_all_gather_matmul).
    if not isinstance(cfg, dict):
        return None
    t = cfg.get("text_config")
    text: Mapping[str, Any] = t if isinstance(t, dict) else {}
    types = {cfg.get("model_type"), text.get("model_type")}
    archs = {
        a
        for c in (cfg, text)
        if isinstance(c.get("architectures"), list)
        for a in c["architectures"]
        if isinstance(a, str)
    }
    if types & {"kimi_k3", "kimi_linear"} or archs & set(KIMI_ARCHS):
        return "kimi_k3"
    if "deepseek_v41" in types or archs & set(DEEPSEEK_ARCHS):
        return "deepseek_v41"
    if types & set(MINIMAX_TYPES) or archs & set(MINIMAX_ARCHS):
        return "minimax_m3"
    if types & set(MUSE_TYPES) or archs & set(MUSE_ARCHS):
        return "muse_spark"
    return None


def read_kernel_model(cfg: Mapping[str, Any], name: str, where: str | None = None) -> KernelModel:
    """The KernelModel of a config.json whose family binds the kernel (one line if unread; §15)."""
    where = where or name
    family = kernel_family(cfg)
    if family is None:
        raise TpcostError(
            f"{where}: vLLM gates a fused GEMM+collective in model code only in Kimi-K3 / "
            "Kimi-Linear "
            f"({', '.join(KIMI_ARCHS)}), DeepSeek-V4.1 ({', '.join(DEEPSEEK_ARCHS)}), MiniMax-M3 "
            f"({', '.join(MINIMAX_ARCHS)}) and Muse Spark ({', '.join(MUSE_ARCHS)})"
        )
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else None
    inner = dict(text) if text is not None else dict(cfg)
    if (
        text is not None
        and "quantization_config" not in inner
        and isinstance(cfg.get("quantization_config"), dict)
    ):
        inner["quantization_config"] = cfg["quantization_config"]
    dtype = (
        inner.get("dtype")
        or inner.get("torch_dtype")
        or cfg.get("dtype")
        or cfg.get("torch_dtype")
        or "bfloat16"
    )
    if not isinstance(dtype, str):
        raise TpcostError(f"{where}: config.json's dtype must be a string, got {dtype!r}")
    hidden, layers = _pos(inner, "hidden_size", where), _pos(inner, "num_hidden_layers", where)
    lac = inner.get("linear_attn_config")
    if lac is not None and not (
        isinstance(lac, dict)
        and isinstance(lac.get("kda_layers") or [], list)
        and all(
            isinstance(x, int) and not isinstance(x, bool) for x in (lac.get("kda_layers") or ())
        )
    ):
        raise TpcostError(
            f"{where}: linear_attn_config must be an object whose kda_layers are integers"
        )
    if isinstance(lac, dict) and not isinstance(lac.get("use_full_rank_gate", False), bool):
        raise TpcostError(f"{where}: linear_attn_config.use_full_rank_gate must be true or false")
    q = inner.get("quantization_config")
    if q is not None and not isinstance(q, dict):
        raise TpcostError(f"{where}: quantization_config must be an object, got {type(q).__name__}")
    for key in QUANT_IGNORE_KEYS:
        names = (q or {}).get(key)
        if names is not None and not (
            isinstance(names, list) and all(isinstance(x, str) for x in names)
        ):
            raise TpcostError(f"{where}: quantization_config.{key} must be a list of module names")
    _check_attention_and_flags(inner, where)
    return KernelModel(name, family, hidden, layers, dtype.replace("torch.", ""), inner)


MLA_FAMILIES = ("kimi_k3", "deepseek_v41")  # their KV is a latent, not heads that TP splits
BOOL_KEYS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_qk_norm", "norm_topk_prob")


def _check_attention_and_flags(inner: Mapping[str, Any], where: str) -> None:
    """What vLLM refuses in a config before it builds the model: a moe_layer_freq entry other than 0
    / 1, a string where a boolean is (one line each)."""
    freq = inner.get("moe_layer_freq")  # an integer period is checked where it is read
    if isinstance(freq, list) and not all(type(x) is int and 0 <= x <= 1 for x in freq):
        raise TpcostError(
            f"{where}: moe_layer_freq must be a list of 0 / 1 per layer, got {str(freq)[:60]}"
        )
    for key in BOOL_KEYS:
        if key in inner and not isinstance(inner[key], bool):
            raise TpcostError(f"{where}: {key} must be true or false, got {inner[key]!r}")


def check_kv_heads_split(km: KernelModel, tp: int, where: str) -> None:
    """KV heads split over TP by vLLM's rule (one line otherwise; §13)."""
    # KV heads that divide the heads: TP % KV == 0 (replicas) when TP >= KV, else KV % TP == 0.
    cfg = km._cfg
    if (
        km.family in MLA_FAMILIES
        or "num_key_value_heads" not in cfg
        or "num_attention_heads" not in cfg
    ):
        return
    heads, kv = _pos(cfg, "num_attention_heads", where), _pos(cfg, "num_key_value_heads", where)
    if kv > heads or heads % kv:
        raise TpcostError(
            f"{where}: num_key_value_heads {kv} must divide num_attention_heads {heads}"
        )
    if tp % kv if tp >= kv else kv % tp:
        raise TpcostError(
            f"{where}: {kv} KV heads do not split over TP {tp} (vLLM needs TP % KV == 0 when TP >= "
            "KV "
            "heads, else KV % TP == 0)"
        )


FORWARD_PARTS = {
    "kimi_k3": "MLA / KDA attention, latent MoE",
    "deepseek_v41": "MLA attention, latent MoE",
    "minimax_m3": "sparse attention, MegaMoE",
    "muse_spark": "hybrid attention, MegaMoE",
}


def refuse_forward(cfg: Mapping[str, Any], where: str) -> None:
    """Raise for a config whose forward tpcost does not model but whose switch it answers (§15)."""
    family = kernel_family(cfg)
    if family is not None:
        raise TpcostError(
            f"{where}: {family}'s forward ({FORWARD_PARTS[family]}) is not modelled; tpcost "
            f"answers its fused-kernel switch instead: tpcost vllm-config --model {where} "
            "--kernel-op "
            f"{'gemm_ar' if family == 'kimi_k3' else 'gemm_rs'}"
        )
