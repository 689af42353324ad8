"""Against the real vLLM 0.34.0 (the current release, a CUDA wheel; commit g62d4bc3c7): laid over
the vLLM 0.32 test venv without its dependencies (README test command: `pip install --no-deps
--target .vllm034 vllm==0.34.0`, then PYTHONPATH=.vllm034), its config classes import on this CPU
machine with that venv's torch 2.13.0+cpu.

Every file:line the 0.34 record cites (costmodel/vllm_tables.py RELEASES) is read back out of the
wheel's files (name, value, line), so a drift fails here; the emitted PassConfig is built by 0.34's
own classes on every built-in GPU; with the wheel importable, whatif, op, vllm-config and the plugin
all resolve 0.34."""

import dataclasses
import io
import json
import re
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from costmodel import vllm_tables as T
from integration.cli import main
from integration.recommend import installed_version

ROOT = Path(__file__).resolve().parents[1]
VERSION = installed_version()
pytestmark = pytest.mark.skipif(
    VERSION != (0, 34), reason="needs the vLLM 0.34.0 wheel on PYTHONPATH (README)"
)
REC = T.RELEASES[(0, 34)]
_CITE = re.compile(r"(vllm/[\w/]+\.py):(\d+)(?:-(\d+))?")


def _site() -> Path:
    import vllm

    return Path(vllm.__file__).resolve().parents[1]


def _lines(cite: str) -> str:
    """The text of the lines `cite` ("vllm/x.py:12-14 ...") names, read from the importable
    wheel."""
    m = _CITE.search(cite)
    assert m, cite
    lo = int(m.group(2))
    hi = int(m.group(3) or lo)
    text = (_site() / m.group(1)).read_text().splitlines()
    return "\n".join(text[lo - 1 : hi])


def _cites(obj) -> list[str]:
    """Every string of the record (recursively) that cites a file:line."""
    if isinstance(obj, str):
        return _CITE.findall(obj) and [obj] or []
    if dataclasses.is_dataclass(obj):
        return [c for f in dataclasses.fields(obj) for c in _cites(getattr(obj, f.name))]
    if isinstance(obj, dict):
        return [c for v in obj.values() for c in _cites(v)]
    if isinstance(obj, (list, tuple)):
        return [c for v in obj for c in _cites(v)]
    return []


def _needles() -> dict[str, list[str]]:
    """cite -> what must stand on its lines (vLLM's name and value), built from the record's own
    values."""
    k, ms = REC.kernel, REC.muse_spark_gemm_rs
    out = {
        k.should_run: ["def should_run", f"return x.shape[0] >= {k.min_m}"],
        k.maybe_init: ["def maybe_init_gemm_rs_ar(", "is_device_capability_family(100)"],
        k.can_run: ["def can_run(", "return True"],
        REC.pass_config_cite: ["class PassConfig"],
        REC.mb_conversion: ["def _set_compile_ranges"],
        REC.cudagraph_cite: [
            f"default_max_graph_size = {T.CUDAGRAPH_MAX_TOKENS_BLACKWELL} if "
            f"is_data_center_blackwell else {T.CUDAGRAPH_MAX_TOKENS_DEFAULT}"
        ],
        REC.switches_cite: [f"{s.env}: bool = {s.default_on}" for s in T.SWITCHES.values()],
        ms.where: [
            "def should_run",
            f"{ms.min_m} <= x.shape[0]",
            f"{ms.align[4]} if self.kernel.world_size == 4 else {ms.align[8]}",
            f"is_device_capability({ms.capability.replace('.', '')})",
            f"tensor_parallel_size not in {tuple(sorted(ms.align))}",
            f"max_num_batched_tokens < {ms.min_m}",
        ],
        REC.shared_expert_cite: [
            "def can_shard_sequence_parallel_shared_expert",
            T.NATIVE_MEGA_MOE,
            *(f'all2all_backend == "{b}"' for b in REC.shared_expert_all2all),
        ],
        REC.notes[0]: ["if self.mnnvl_only:"],
        REC.notes[1]: ["as_quantized_activation"],
    }
    for name, (_, where) in REC.tables.items():
        out[where] = [name]
    out.update(_ep_needles())
    for (
        g
    ) in REC.gate_inventory:  # each gate-named constant stands on its line as the record writes it
        # a constant set there; a range cites where it is read
        one_line = "-" not in g.where.rsplit(":", 1)[1]
        out[g.where] = [g.name, f"= {g.value}"] if one_line else [g.name]
        if "vllm/" in g.exposed:
            out[g.exposed] = [g.name, f'"{g.value}"']
    # each gate's strings: checked cite by cite in test_every_model_gate_cite_is_in_the_wheel
    for g in REC.model_gates:
        for text in (g.where, g.used, g.activates):
            out.setdefault(text, [])
    return out


def _ep_needles() -> dict[str, list[str]]:
    """What stands on the lines the 0.34 record's EP and DBO rules cite, built from the record's own
    values."""
    ep = REC.ep
    d, p = ep.dbo_thresholds["decode"], ep.dbo_thresholds["prefill"]
    return {
        ep.all2all_backends_cite: [
            "All2AllBackend = Literal[",
            *(f'"{b}",' for b in ep.all2all_backends),
        ],
        ep.aliases_cite: [
            *(f'"{k}"' for k in ep.aliases),
            *(f'self.all2all_backend = "{v}"' for v in set(ep.aliases.values())),
        ],
        ep.dbo_thresholds_cite: [
            f"dbo_decode_token_threshold: int = Field(default={d}",
            f"dbo_prefill_token_threshold: int = Field(default={p}",
            "TODO(lucas): tune",
        ],
        ep.dbo_rule_cite: [
            "def check_ubatch_thresholds",
            "num_tokens >= config.dbo_decode_token_threshold",
            "num_tokens >= config.dbo_prefill_token_threshold",
        ],
        ep.split_cite: [
            "def _pad_out_ubatch_slices",
            "split_point = int(num_tokens_padded) // num_ubatches",
        ],
        ep.ubatches_cite: [f"return {ep.ubatches} if self.enable_dbo"],
        ep.thresholds_min_cite: ["< self.num_ubatches", "raise ValueError"],
        ep.dbo_backends_cite: [
            "assert a2a_backend in supported_backends",
            *(f'"{b}",' for b in ep.dbo_backends),
        ],
        ep.dp_one_cite: ["def maybe_build_ubatch_runner", "data_parallel_size <= 1"],
        ep.spec_decode_cite: [
            "def _raise_dbo_thresholds_for_spec_decode",
            "parallel_config.num_ubatches * self.uniform_decode_query_len",
        ],
        ep.unsupported_cite: [
            "def _get_dbo_unsupported_features",
            "dual batch overlap with LoRA",
            "dual batch overlap with pipeline parallelism",
            "dual batch overlap with PIECEWISE CUDA graphs",
        ],
        ep.yields_cite: ["dbo_register_recv_hook(hook)", "dbo_yield()"],
        ep.batched_dp_cite: [
            "def use_batched_dp_moe",
            *(f'"{b}",' for b in ep.batched_dp_backends),
            "data_parallel_size > 1",
        ],
        ep.budget_cite: [
            f"DEFAULT_MAX_NUM_BATCHED_TOKENS: ClassVar[int] = {ep.default_budget}",
            "DEFAULT_MAX_NUM_BATCHED_TOKENS_FOR_BATCHED_DP: ClassVar[int] = "
            f"{ep.batched_dp_budget}",
        ],
        ep.budget_default_cite: [
            "use_batched_dp_moe",
            "DEFAULT_MAX_NUM_BATCHED_TOKENS_FOR_BATCHED_DP",
        ],
        ep.comm_sms_cite: ['"VLLM_DBO_COMM_SMS"', f'else "{ep.comm_sms}"'],
        ep.deepep_sms_cite: [f"self.num_sms = {ep.deepep_sms}"],
        ep.sm_control_cite: [
            "comm_sms: int = envs.VLLM_DBO_COMM_SMS",
            "comm_sms = min(comm_sms, max_sms_used)",
            "all2all_manager.set_num_sms(sms)",
            "deep_gemm_set_num_sms(sms)",
        ],
        ep.graphs_off_cite: [
            'all2all_backend == "deepep_high_throughput"',
            "data_parallel_size > 1",
            "self.cudagraph_mode = CUDAGraphMode.NONE",
        ],
        ep.fp8_dispatch_cite: ["use_fp8_dispatch", "DEEPEP_QUANT_BLOCK_SHAPE"],
        ep.mla_decode_cite: [
            'einsum("snh,lnh->snl", q_nope, W_UK)',
            "MQA",
            'einsum("snl,lnv->snv"',
        ],
        ep.mla_prefill_cite: ["new_k_nope = (new_kv_c @ W_UK", "MHA"],
        ep.shared_overlap_cite: [
            "self.prepare_finalize.finalize_async(",
            "self._maybe_apply_shared_experts(shared_experts, shared_experts_input)",
        ],
        ep.shared_stream_cite: [
            "should_run_shared_in_aux_stream = (",
            "<= envs.VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD",
            "return SharedExpertsOrder.MULTI_STREAM_OVERLAPPED",
        ],
        ep.dp_vote_eager_cite: [
            "int(num_tokens_across_dp.min())",
            "int(num_tokens_across_dp.max())",
            "if 2 * int(num_tokens_across_dp.min()) < ubatch_desc.num_tokens:",
        ],
    }


# what stands on the lines each model gate cites (every cite of every string, keyed by file:lines),
# built from the gates' own values where they carry one
def _gate_needles() -> dict[str, list[str]]:
    gates = {g.key: g for g in REC.model_gates}
    mm, ag = gates["minimax_m3.gemm_rs"], gates["common.ag_gemm"]
    ms, one, floor = (
        gates["muse_spark.gemm_rs"],
        gates["muse_spark.oneshot_ar"],
        gates["muse_spark.sp_floor"],
    )
    mf, sf = gates["minimax_m3.finalize_ar"], gates["muse_spark.finalize_ar"]
    m, mu, mg = (
        "vllm/models/minimax_m3/nvidia/model.py",
        "vllm/models/muse_spark/nvidia/model.py",
        "vllm/models/muse_spark/nvidia/mega_moe.py",
    )
    mfin, run = (
        "vllm/models/minimax_m3/nvidia/ops/finalize_allreduce_norm.py",
        sf.where.split(":")[0],
    )
    return {
        mf.where: [f"{mf.constant} = {mf.value}"],
        f"{m}:1394-1398": ["defers_finalize(", "forward_unfinalized(hidden_states)"],
        f"{m}:1508-1516": [
            "for layer, successor in zip(layers, layers[1:])",
            "successor.fuse_input_allreduce",
            "== kMxfp8Dynamic",
            f"defer_finalize({mf.constant})",
        ],
        f"{mfin}:726-749": [
            "def supports_fused_moe_finalize",
            "get_tensor_model_parallel_world_size() <= 1",
            "enable_expert_parallel",
            "is_device_capability_family(100)",
            "torch.bfloat16",
            "_has_local_multicast_support",
        ],
        f"{m}:646-661": ["def defer_finalize", "use_mega_moe", "TrtLlmNvFp4ExpertsModular"],
        "vllm/model_executor/layers/fused_moe/runner/moe_runner.py:803-806": [
            "result = shared_output + fused_output"
        ],
        f"{m}:1352-1355": ["fuse_input_allreduce", "fused_allreduce_gemma_rms_norm("],
        sf.where: [
            f"{sf.constant} = {sf.value}",
            f"{sf.multi_node_constant} = {sf.multi_node_value}",
            "TP4 gains up to 256 tokens, two-node TP8 only to 128",
        ],
        f"{run}:225-229": [sf.multi_node_constant, "if tp_group_spans_nodes()", sf.constant],
        f"{run}:250-254": [
            "num_tokens <= self._all_reduce_max_tokens",
            "moe_finalize_rmsnorm_allreduce",
        ],
        f"{run}:200-216": [
            "def _create_all_reduce",
            "pc.ep_size != get_tp_group().world_size",
            "pc.dp_size != 1",
            "pc.use_all2all_kernels",
            "pc.is_sequence_parallel",
            "self.pre_norm_all_reduce",
        ],
        f"{mu}:545-562": [
            "replicated_tokens = (",
            "not self.use_mega_moe and not self.is_sequence_parallel",
            "data_parallel_size == 1",
            "use_tep_optimizations = (",
        ],
        "vllm/models/muse_spark/nvidia/ops/mnnvl_fusions.py:33-46": [
            "is_device_capability_family(100)",
            "is_multicast_supported(",
            "world_size > 1",
        ],
        f"{run}:903-905": ["self._maybe_reduce_final_output("],
        mm.where: [f"{mm.constant} = {mm.value}"],
        f"{m}:240-261": ["def _maybe_init_gemm_rs", f"max_num_batched_tokens < {mm.constant}"],
        f"{m}:276-285": ["def _row_parallel_reduce_scatter", f"num_tokens >= {mm.constant}"],
        f"{m}:224-237": [
            "def _use_sequence_parallel",
            "enable_expert_parallel",
            "tensor_parallel_size > 1",
        ],
        f"{m}:201-221": ["def _use_mega_moe", '"NVFP4"', "raise NotImplementedError"],
        ag.where: [f"{ag.constant} = {ag.value}"],
        ag.used: [
            "def can_sp_all_gather_matmul",
            ag.constant,
            "torch.bfloat16",
            "is_current_stream_capturing",
        ],
        f"{mu}:1266-1272": [
            "def can_fuse_sp_gather",
            "UnquantizedLinearMethod",
            "can_sp_all_gather_matmul",
        ],
        ms.where: [
            "def should_run",
            f"{ms.value} <= x.shape[0]",
            f"{ms.align[4]} if self.kernel.world_size == 4 else {ms.align[8]}",
        ],
        ms.used: ["self.gemm_rs.should_run", "sp_active"],
        f"{mu}:392-401": [
            "def is_sequence_parallel_enabled",
            "deep_gemm_mega_moe",
            "enable_expert_parallel",
        ],
        one.where: [f"{one.constant} = {one.value}"],
        one.used: ["def _fuses_attn_all_reduce", f"num_tokens <= {one.constant}"],
        f"{mu}:1806-1821": ["def _configure_attn_all_reduce", "maybe_create_all_reduce_dual_norm"],
        floor.where: [
            f"_TRTLLM_TOKEN_THRESHOLD_TEP4 = {floor.value[4]}",
            f"_TRTLLM_TOKEN_THRESHOLD_TEP8 = {floor.value[8]}",
        ],
        f"{mu}:527": ["threshold + 1"],
        f"{mu}:1535": ["get_trtllm_token_threshold(vllm_config) + 1"],
        f"{mu}:1730": ["get_trtllm_token_threshold(vllm_config) + 1"],
        f"{mg}:65-79": [
            "def get_trtllm_token_threshold",
            "ModelOptNvFp4Config",
            "tensor_parallel_size in (4, 8)",
        ],
    }


def test_every_model_gate_cite_is_in_the_wheel():
    """Every file:line in every string of every 0.34 model gate (where it is set, where it gates,
    what activates it) holds vLLM's name and value there."""
    needles = _gate_needles()
    seen = set()
    for g in REC.model_gates:
        for text in (g.where, g.used, g.activates):
            for m in re.finditer(r"(vllm/[\w/]+\.py):(\d+(?:-\d+)?(?:, \d+(?:-\d+)?)*)", text):
                for part in m.group(2).split(", "):
                    key = f"{m.group(1)}:{part}"
                    assert key in needles, (g.key, key)
                    seen.add(key)
                    body = _lines(key)
                    for needle in needles[key]:
                        assert needle in body, (g.key, key, needle, body)
    assert seen == set(needles)


def test_every_cited_line_of_the_034_record_is_in_the_wheel():
    needles = _needles()
    cites = _cites(REC)
    # nothing the record cites goes unchecked
    assert set(cites) <= set(needles), set(cites) - set(needles)
    for cite in cites:
        text = _lines(cite)
        for needle in needles[cite]:
            assert needle in text, (cite, needle, text)
    # what 0.32 removed stays removed
    assert not (_site() / "vllm/compilation/passes/fusion/sequence_parallelism.py").exists()


def test_the_034_tables_are_the_wheel_s():
    sys.path.insert(0, str(ROOT / "tools"))
    from read_vllm_tables import read

    got = read(str(_site()))
    assert got["version"] == "0.34.0" and got["commit"] == "g62d4bc3c7"
    from costmodel.vllm_tables import Vllm

    for name, entry in got["tables"].items():
        value, where = REC.tables[name]
        assert where == f"{entry['file']}:{entry['line']}", name
        assert _norm(value) == entry["value"], name
    from vllm.distributed.device_communicators import all_reduce_utils as ar

    v = Vllm((0, 34))
    for name in (
        "CUSTOM_ALL_REDUCE_MAX_SIZES",
        "SYMM_MEM_ALL_REDUCE_MAX_SIZES",
        "FI_MNNVL_ALLREDUCE_MAX_SIZE_MB",
    ):
        assert getattr(ar, name) == v.table(name)[0], name


def _norm(v):
    """JSON's view of a table, as tools/read_vllm_tables.py writes it: string keys, lists for
    tuples."""
    if isinstance(v, dict):
        return {
            (json.dumps(list(k)) if isinstance(k, tuple) else str(k)): _norm(x)
            for k, x in v.items()
        }
    if isinstance(v, (list, tuple)):
        return [_norm(x) for x in v]
    return v


def _run(*argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(list(argv))
    assert rc == 0, err.getvalue()
    return out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    "gpu",
    [
        "a100-sxm-80gb",
        "a800",
        "b200",
        "b300",
        "gb200-nvl72",
        "gb300-nvl72",
        "h100-sxm",
        "h200-sxm",
        "h800",
        "l40s",
        "mi300x",
    ],
)
def test_vllm_config_034_on_every_builtin_gpu_is_accepted_by_034s_classes(gpu):
    from vllm.config import CompilationConfig, PassConfig

    for tp in (2, 4, 8):
        out, err = _run(
            "vllm-config",
            "--format",
            "json",
            "--gpu",
            gpu,
            "--model",
            "llama-3.1-70b",
            "--tp",
            str(tp),
            "--vllm-version",
            "0.34",
        )
        cc = json.loads(out)
        assert "config for vLLM 0.34 (--vllm-version 0.34)" in err
        assert (
            set(cc["pass_config"])
            <= set(REC.pass_config_fields)
            <= set(PassConfig.__dataclass_fields__)
        )
        built = CompilationConfig(**cc)
        for k, v in cc["pass_config"].items():
            assert getattr(built.pass_config, k) == v
    assert "sp_min_token_num" not in PassConfig.__dataclass_fields__ and not REC.sp_passes


def test_with_034_importable_every_command_and_the_plugin_resolve_034():
    w = json.loads(_run("whatif", "--no-band", "--json", "--tokens", "1024")[0])
    o = json.loads(
        _run(
            "op",
            "--gpu",
            "b200",
            "--tp",
            "4",
            "--op",
            "gemm_ar",
            "--impl",
            "kernel",
            "--n",
            "7168",
            "--k",
            "1536",
            "--json",
        )[0]
    )
    _, err = _run("vllm-config", "--gpu", "h100-sxm", "--tp", "4")
    assert w["vllm_version"] == o["vllm_version"] == "0.34"
    assert w["vllm_version_source"].startswith("installed distribution vllm 0.34.0")
    assert "config for vLLM 0.34 (installed distribution vllm 0.34.0)" in err
    assert w["cutoff_tokens"] is None and w["sp_passes"] is False
    import vllm

    from integration.vllm_plugin import _vllm_version

    assert vllm.__version__ == "0.34.0" and _vllm_version(False) == [0, 34]


def test_kernel_switch_contract_on_034(monkeypatch):
    """The plugin's reading of 0.34's ParallelConfig / KernelConfig gives the mode the worker binds,
    and 0.34's envs read the switches the plugin writes (unset: GEMM-AR on, GEMM-RS off)."""
    import vllm.envs as envs
    from vllm.config import KernelConfig, ParallelConfig

    from costmodel.shapes import load_model_config, read_kernel_model
    from costmodel.vllm_tables import Parallel
    from integration.vllm_plugin import kernel_parallel

    cfg, name, where = load_model_config(str(ROOT / "tests" / "fixtures" / "kimi-k3.config.json"))
    km = read_kernel_model(cfg, name, where)
    for pc, kc, mode in (
        (ParallelConfig(tensor_parallel_size=8), KernelConfig(), "gemm_ar"),
        (
            ParallelConfig(
                tensor_parallel_size=8, enable_expert_parallel=True, data_parallel_size=2
            ),
            KernelConfig(),
            "gemm_rs",
        ),
        (
            ParallelConfig(tensor_parallel_size=8, enable_expert_parallel=True),
            KernelConfig(moe_backend="deep_gemm_mega_moe"),
            "gemm_rs",
        ),
    ):
        assert km.mode(Parallel(**kernel_parallel(pc, kc))) == mode
    for s in T.SWITCHES.values():
        monkeypatch.delenv(s.env, raising=False)
        assert getattr(envs, s.env) is s.default_on
        monkeypatch.setenv(s.env, str(int(not s.default_on)))
        assert getattr(envs, s.env) is (not s.default_on)


def test_the_plugin_sets_its_switch_and_logs_each_gate_with_034s_classes(monkeypatch, tmp_path):
    """0.34's ParallelConfig / KernelConfig read by the plugin, MiniMax-M3 under MegaMoE: the plan
    sets the switch it owns (VLLM_ENABLE_GEMM_RS, which 0.34's envs then read) and logs the gate's
    constant beside tpcost's value; the constant itself is not touched."""
    import vllm.envs as envs
    from vllm.config import KernelConfig, ParallelConfig

    from costmodel.shapes import load_model_config
    from integration.vllm_plugin import _kernel_plan, kernel_parallel

    monkeypatch.setenv("TPCOST_PROFILE", "gb300-nvl72")
    monkeypatch.setenv("TPCOST_CACHE_DIR", str(tmp_path))
    cfg, name, _ = load_model_config(
        str(ROOT / "data" / "reference" / "models" / "minimax-m3.config.json")
    )
    par = kernel_parallel(
        ParallelConfig(tensor_parallel_size=4, enable_expert_parallel=True),
        KernelConfig(moe_backend="deep_gemm_mega_moe"),
    )
    plan = _kernel_plan(
        {
            "kernel_model": cfg,
            "model": name,
            "parallel": par,
            "op": "gemm_rs",
            "max_tokens": 8192,
            "want_fi": True,
            "fuse_allreduce_rms": None,
            "fi_allreduce_fusion_max_size_mb": None,
            "vllm_version": [0, 34],
        }
    )
    ((env, value),) = plan["env"]
    assert env == "VLLM_ENABLE_GEMM_RS" and value in ("0", "1")
    monkeypatch.setenv(env, value)
    assert getattr(envs, env) is (value == "1")
    lines = {line.split(":")[1].strip(): line for line in plan["gates"]}
    assert set(lines) == {"minimax_m3.gemm_rs", "minimax_m3.finalize_ar"}
    line = lines["minimax_m3.gemm_rs"]
    assert "_GEMM_RS_MIN_TOKENS = 1024" in line and "tpcost's" in line
    # MegaMoE finalizes in its own kernel: the deferred finalize is not reached
    fin = lines["minimax_m3.finalize_ar"]
    assert "FUSED_MOE_FINALIZE_MAX_TOKENS = 32" in fin and "not reached here" in fin
    # reported, never patched
    assert all("left as vLLM has it" in x for x in lines.values()) and not plan["set"]


@pytest.mark.parametrize("backend", ["deepep_low_latency", "deepep_high_throughput"])
@pytest.mark.parametrize("ep", [8, 16, 32])
def test_dbo_arguments_parse_and_gate_as_tpcost_decided_in_034(backend, ep):
    """`tpcost ep --dbo`'s vLLM arguments go through 0.34's own argument parser and ParallelConfig,
    and 0.34's check_ubatch_thresholds microbatches exactly the steps tpcost decided: from each
    threshold on, never below, and never inside the budget where tpcost says DBO does not pay
    there."""
    from vllm.config import ParallelConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.worker.ubatch_utils import check_ubatch_thresholds

    out, _ = _run(
        "ep",
        "--enable-expert-parallel",
        "--data-parallel-size",
        str(ep),
        "--all2all-backend",
        backend,
        "--dbo",
        "--json",
        "--tokens",
        "1",
    )
    d = json.loads(out)
    dbo, budget = d["dbo"], d["setup"]["max_num_batched_tokens"]
    args = dbo["vllm_args"]
    emitted, _ = _run(
        "vllm-config",
        "--model",
        "deepseek-v3",
        "--gpu",
        "h200-sxm",
        "--enable-expert-parallel",
        "--data-parallel-size",
        str(ep),
        "--all2all-backend",
        backend,
        "--format",
        "args",
    )
    assert emitted.split() == args  # vllm-config emits what ep decided
    if not dbo["enable"]:
        assert args == [] and all(
            dbo["phases"][ph]["threshold_tokens"] is None for ph in ("decode", "prefill")
        )
        return
    # vLLM's parser cannot be built without a device platform (DeviceConfig), so the flags are read
    # as it reads them: each `--x-y` is an EngineArgs field x_y registered by that name in
    # arg_utils.py
    src = (_site() / "vllm/engine/arg_utils.py").read_text()
    kw: dict = {}
    for i, a in enumerate(args):
        if a.startswith("--"):
            field = a[2:].replace("-", "_")
            assert field in EngineArgs.__dataclass_fields__ and f'"{a}"' in src, a
            nxt = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None
            kw[field] = True if nxt is None else int(nxt)
    assert kw["enable_dbo"] is True
    cfg = ParallelConfig(
        data_parallel_size=ep, enable_expert_parallel=True, all2all_backend=backend, **kw
    )
    for phase, uniform in (("decode", True), ("prefill", False)):
        thr = dbo["phases"][phase]["threshold_tokens"]
        on = [
            n
            for n in range(1, budget + 1)
            if check_ubatch_thresholds(cfg, n, uniform_decode=uniform)
        ]
        if thr is None:
            assert on == [], (phase, on[:3])
        else:
            assert on == list(range(max(thr, REC.ep.ubatches), budget + 1)), phase


def test_the_plugin_sets_the_dbo_thresholds_left_unset_on_034s_parallel_config(
    monkeypatch, tmp_path
):
    """On 0.34's own ParallelConfig with DBO turned on by the user: the plugin sets each threshold
    left at vLLM's default to tpcost's value and keeps one the user set; the result passes 0.34's
    validation and its check_ubatch_thresholds microbatches from tpcost's thresholds. It never turns
    DBO on."""
    from types import SimpleNamespace

    from vllm.config import ParallelConfig
    from vllm.v1.worker.ubatch_utils import check_ubatch_thresholds

    from integration.vllm_plugin import _apply_dbo

    monkeypatch.setenv("TPCOST_PROFILE", "h200-sxm")
    monkeypatch.setenv("TPCOST_CACHE_DIR", str(tmp_path))
    hf = json.loads((ROOT / "costmodel" / "models" / "deepseek-v3.json").read_text())

    def cfg(**kw):
        par = ParallelConfig(
            data_parallel_size=16,
            data_parallel_size_local=8,
            enable_expert_parallel=True,
            all2all_backend="deepep_low_latency",
            **kw,
        )
        mc = SimpleNamespace(
            hf_text_config=SimpleNamespace(to_dict=lambda: hf), model="deepseek-ai/DeepSeek-V3"
        )
        return SimpleNamespace(
            parallel_config=par,
            model_config=mc,
            scheduler_config=SimpleNamespace(max_num_batched_tokens=256),
        )

    off = cfg()
    _apply_dbo(off, has_sp=False)
    assert (
        off.parallel_config.enable_dbo is False
        and off.parallel_config.dbo_decode_token_threshold == 32
    )
    out, _ = _run(
        "ep",
        "--enable-expert-parallel",
        "--data-parallel-size",
        "16",
        "--all2all-backend",
        "deepep_low_latency",
        "--dbo",
        "--json",
        "--tokens",
        "1",
    )
    d = json.loads(out)["dbo"]
    on = cfg(enable_dbo=True, dbo_prefill_token_threshold=100)  # the user's prefill value is kept
    _apply_dbo(on, has_sp=False)
    p = on.parallel_config
    assert (p.dbo_decode_token_threshold, p.dbo_prefill_token_threshold) == (
        d["decode_token_threshold"],
        100,
    )
    again = ParallelConfig(
        data_parallel_size=16,
        enable_expert_parallel=True,
        all2all_backend="deepep_low_latency",
        enable_dbo=True,
        dbo_decode_token_threshold=p.dbo_decode_token_threshold,
        dbo_prefill_token_threshold=p.dbo_prefill_token_threshold,
    )
    thr = d["decode_token_threshold"]
    assert not check_ubatch_thresholds(again, thr - 1, uniform_decode=True)
    assert check_ubatch_thresholds(again, thr, uniform_decode=True)


def test_every_gate_named_constant_of_the_wheel_is_classified():
    """Issue 60: every constant of 0.34's model, layer and communicator code named like a gate is in
    the record's inventory, classified, and every scanned entry still stands where the record
    says."""
    sys.path.insert(0, str(ROOT / "tools"))
    from read_vllm_tables import unclassified_gates

    new, gone = unclassified_gates(str(_site()), REC.gate_inventory)
    assert not new and not gone, (new, gone)
    assert sum(g.kind == "comm" for g in REC.gate_inventory) >= 15


def test_the_serve_line_is_made_of_034s_own_flags():
    """vllm-config --format serve: every flag of its `vllm serve` line is an EngineArgs field
    registered by that name in 0.34's arg_utils.py (read as the DBO test reads them: the parser
    needs a device platform), for the DBO setup and for a TP model's compilation config."""
    import shlex

    from vllm.engine.arg_utils import EngineArgs

    src = (_site() / "vllm/engine/arg_utils.py").read_text()
    for argv in (
        (
            "--model",
            "deepseek-v3",
            "--gpu",
            "h200-sxm",
            "--enable-expert-parallel",
            "--data-parallel-size",
            "16",
            "--all2all-backend",
            "deepep_low_latency",
        ),
        ("--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "4"),
    ):
        out, _ = _run("vllm-config", *argv, "--format", "serve")
        words = shlex.split(out.strip().splitlines()[-1])
        flags = [w for w in words[3:] if w.startswith("--")]
        assert flags
        for a in flags:
            assert a[2:].replace("-", "_") in EngineArgs.__dataclass_fields__ and f'"{a}"' in src, a


def test_the_shared_experts_overlap_reads_as_the_wheel_has_it():
    """EP.async_backends: each priced DeepEP backend's prepare/finalize says supports_async -> True
    in 0.34, and the modular-kernel overlap comes before the aux-stream token threshold (so that
    threshold gates nothing there)."""
    ep = REC.ep
    pf = _site() / "vllm/model_executor/layers/fused_moe/prepare_finalize"
    for b, f in (
        ("deepep_low_latency", "deepep_ll.py"),
        ("deepep_high_throughput", "deepep_ht.py"),
    ):
        assert b in ep.async_backends
        text = (pf / f).read_text()
        i = text.index("def supports_async(self) -> bool:")
        assert text[i : i + 80].split("return", 1)[1].strip().startswith("True"), f
    order = (_site() / "vllm/model_executor/layers/fused_moe/runner/shared_experts.py").read_text()
    assert order.index("return SharedExpertsOrder.MK_INTERNAL_OVERLAPPED") < order.index(
        "envs.VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD"
    )
    envs = (_site() / "vllm/envs.py").read_text()
    assert (
        f'os.getenv("VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD", {ep.shared_stream_tokens})'
        in envs
    )
