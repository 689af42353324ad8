"""The run's defaults, declared once; every command and the plugin read them here (§9)."""
# The run's defaults, declared once (no imports: the vLLM plugin reads them without loading the
# model). costmodel.model's RunConfig / Regime / DecodeRegime take them as their field defaults;
# every command's flags and their --help read them from here.

DEFAULT_SEQ_LEN = 1024  # prefill sequence length (attention's quadratic term)
# vLLM's max_num_batched_tokens where the caller states none (vLLM's own default)
DEFAULT_BUDGET_TOKENS = 8192
DEFAULT_MARGIN = 0.02  # the risk premium every decision puts on the fused / overlapped side
# tokens of KV cache a decode reads where the caller states none (docs/model.md §5)
DEFAULT_CONTEXT_LEN = 1024
# a step's largest DP rank's tokens over its smallest's: every rank alike
DEFAULT_DP_TOKEN_SPREAD = 1.0
# the fused kernel's share of the SMs: all of them, no concurrent work
DEFAULT_KERNEL_SM_SHARE = 1.0
DEFAULT_MAX_NUM_SEQS = 256  # vLLM's max_num_seqs: the decodes a step holds at most
