"""Run in a fresh process by tests/test_vllm_integration.py: builds real vLLM 0.31 configs
(EngineArgs(...).create_engine_config(), which loads the `tpcost` general plugin through its entry
point) and prints one JSON object with what vLLM ended up with. Nothing of vLLM is mocked or
patched."""

import json
import os
import sys

from vllm_accepts import accepted
from vllm.engine.arg_utils import EngineArgs

MODEL = sys.argv[1]


def build(tp, cc, **kw):
    cfg = EngineArgs(
        model=MODEL,
        tensor_parallel_size=tp,
        skip_tokenizer_init=True,
        load_format="dummy",
        max_num_batched_tokens=8192,
        compilation_config=cc,
        **kw,
    ).create_engine_config()
    pc = cfg.compilation_config.pass_config
    return {
        "enable_sp": pc.enable_sp,
        "fuse_gemm_comms": pc.fuse_gemm_comms,
        "sp_min_token_num": pc.sp_min_token_num,
        "fi_allreduce_fusion_max_size_mb": pc.fi_allreduce_fusion_max_size_mb,
        "fuse_allreduce_rms": pc.fuse_allreduce_rms,
        "endpoints": sorted(cfg.compilation_config.compile_ranges_endpoints or []),
    }


out = {}
sp_on = {"pass_config": {"enable_sp": True, "fuse_gemm_comms": True}}
for tp in (2, 4):
    out[f"plugin_tp{tp}"] = build(tp, sp_on)
out["enforce_eager_tp4"] = build(4, sp_on, enforce_eager=True)  # the regime is read from the config
out["capture_2048_tp4"] = build(4, {**sp_on, "max_cudagraph_capture_size": 2048})
out["user_value_tp2"] = build(
    2, {"pass_config": {"enable_sp": True, "fuse_gemm_comms": True, "sp_min_token_num": 777}}
)
out["sp_off_tp2"] = build(2, {"pass_config": {"enable_sp": False}})
# the decision cache (integration/plugin_cache.py): the same inputs read the plan back, in this
# process too
cache = os.environ["TPCOST_CACHE_DIR"]
out["cache_entries"] = len([f for f in os.listdir(cache) if f.endswith(".json")])
out["cached_tp2"] = build(2, sp_on)
# malformed entries, and plans setting what the plugin never sets
for i, f in enumerate(sorted(os.listdir(cache))):
    with open(os.path.join(cache, f), "w") as fh:
        fh.write(
            "{not json"
            if i % 2 == 0
            else json.dumps(
                {
                    "set": [["max_num_seqs", 1]],
                    "said": [],
                    "profile_name": "x",
                    "profile_tier": "assumed",
                }
            )
        )
out["after_corruption_tp2"] = build(2, sp_on)
out["after_corruption_tp4"] = build(4, sp_on)
os.environ["TPCOST_CACHE_DIR"] = os.path.join(cache, "off")
os.environ["TPCOST_CACHE"] = "0"
out["cache_off_tp2"] = build(2, sp_on)
out["cache_off_wrote"] = os.path.exists(os.environ["TPCOST_CACHE_DIR"])
os.environ["TPCOST_CACHE"] = "maybe"  # not a setting: one warning, cache off, the decision stands
out["cache_bad_setting_tp2"] = build(2, sp_on)
out["cache_bad_setting_wrote"] = os.path.exists(os.environ["TPCOST_CACHE_DIR"])
del os.environ["TPCOST_CACHE"]
os.environ["TPCOST_CACHE_DIR"] = os.path.join(
    cache, next(f for f in os.listdir(cache) if f.endswith(".json"))
)
# a file as the directory: one warning, the decision stands
out["cache_dir_is_file_tp2"] = build(2, sp_on)
os.environ["TPCOST_CACHE_DIR"] = cache
# TPCOST_WORKLOAD: the decision serves that traffic, and the cache keys on the file's bytes (same
# path, new content)
wl = os.path.join(cache, "traffic.csv")
for name, text in (
    ("workload_large_tp4", "num_tokens,count\n8192,1000\n"),
    ("workload_small_tp4", "num_tokens,count\n64,1000\n"),
):
    with open(wl, "w") as fh:
        fh.write(text)
    os.environ["TPCOST_WORKLOAD"] = wl
    out[name] = build(4, sp_on)
os.environ["TPCOST_WORKLOAD"] = os.path.join(cache, "no-such-traffic.csv")
out["workload_missing_tp4"] = build(4, sp_on)  # one warning naming the file; vLLM's default stands
del os.environ["TPCOST_WORKLOAD"]
# a profile outside the plausible ranges (docs/profiles.md): one warning naming the key; vLLM's
# default stands
src = open(
    os.path.join(os.path.dirname(__file__), "..", "costmodel", "profiles", "h100-sxm.toml")
).read()
bad = os.path.join(cache, "absurd.toml")
with open(bad, "w") as fh:
    fh.write(src.replace("sm_count = 132", "sm_count = 1e308"))
os.environ["TPCOST_PROFILE"] = bad
out["out_of_range_profile_tp2"] = build(2, sp_on)
os.environ["TPCOST_PROFILE"] = "h100-sxm"
os.environ["TPCOST_PLUGIN_FAIL_FOR_TEST"] = "1"
out["injected_failure_tp2"] = build(2, sp_on)
del os.environ["TPCOST_PLUGIN_FAIL_FOR_TEST"]
os.environ["TPCOST_DISABLE"] = "1"
out["disabled_tp2"] = build(2, sp_on)
del os.environ["TPCOST_DISABLE"]
# SP without AsyncTP: fuse_gemm_comms false, or unset (vLLM 0.31 resolves it to false): the SP-alone
# cutoff
out["sp_alone_explicit_tp4"] = build(
    4, {"pass_config": {"enable_sp": True, "fuse_gemm_comms": False}}
)
out["sp_alone_unset_tp4"] = build(4, {"pass_config": {"enable_sp": True}})
# docs/vllm-plugin.md's table "What the plugin sets": one config per row (vLLM's CPU build resolves
# an unset fuse_allreduce_rms to false: enable_allreduce_rms_fusion needs CUDA)
out["doc_nothing_tp4"] = build(4, {})
out["doc_fusion_on_tp4"] = build(4, {"pass_config": {"fuse_allreduce_rms": True}})
out["doc_fusion_on_sp_tp4"] = build(
    4, {"pass_config": {"enable_sp": True, "fuse_gemm_comms": True, "fuse_allreduce_rms": True}}
)
out["doc_fusion_off_sp_tp4"] = build(
    4, {"pass_config": {"enable_sp": True, "fuse_allreduce_rms": False}}
)
out["doc_user_range_sp_tp4"] = build(
    4,
    {
        "pass_config": {
            "enable_sp": True,
            "fuse_allreduce_rms": True,
            "fi_allreduce_fusion_max_size_mb": 0.5,
        }
    },
)
# `tpcost vllm-config --format json` outputs handed to vLLM's own CompilationConfig
out["vllm_config_json_accepted"] = accepted(sys.argv[2:])
print("RESULT " + json.dumps(out))
