"""pytest plugin (-p subset_select) for run_subset.sh: deterministically keeps a manageable subset of
upstream flash-attn's tests (test_flash_attn_v26.py or the old test_flash_attn.py), reading each
test's parameters (item.callspec.params), not its id. Environment:
  FAC_DTYPE        dtype to run (default bfloat16); tests with another dtype, or none, are dropped
  FAC_RETARGET     auto (default) or 0. auto: a test function with no FAC_DTYPE case but float16
                   cases (test_flash_attn_v26.py is the ROCm-era file, float16 only) runs those cases
                   with FAC_DTYPE instead (the dtype parameter is rewritten; node ids keep "dtype0")
  FAC_MAX_D        largest head dim d to keep (default 128); FAC_MIN_D smallest (default 0)
  FAC_KERNEL_DIMS  comma list of kernel head dims (e.g. "64,128"): keep a test only if its d rounded
                   up to the next of 32, 64, 96, 128, 192, 256 (the kernel flash_attn_cute runs it on)
                   is listed. Tests without a d parameter count as 128: kept when this is unset or
                   lists 128
  FAC_UNSKIP       0 (default): tests under an unconditional @pytest.mark.skip (the file's splitkv,
                   race-condition, bwd-overflow/transpose and deterministic tests) are dropped, as
                   they would only report "skipped"; 1: their skip mark is removed and they run
  FAC_BUILT_ONLY   1 (default): when flash_attn_cute's extension imports, drop tests needing a
                   forward/backward kernel (dtype, kernel head dim, causal, plain/mods/dropout) this
                   build lacks (the count is printed); 0: keep them (they fail NotImplementedError)
  FAC_MAX_TESTS    cap (default 2400): each test function keeps the same fraction of its eligible
                   cases (at least one), the ones whose sha1(node id) sort first (stable across runs)
  FAC_PER_FUNC_MAX optional cap per test function (e.g. 600: test_flash_attn_kvcache is ~85% of the
                   eligible cases); what it frees goes to the other functions, same fraction each
Cases whose body would pytest.skip() for their parameters alone (BODY_SKIPS) are never eligible.
  FAC_FUNCS        optional comma list of test function names: only those are eligible
  FAC_SELECTED     if set, the kept node ids are written there, one a line
"""
import hashlib
import math
import os

import torch

KERNEL_HEAD_DIMS = (32, 64, 96, 128, 192, 256)  # flash_attn_cute/_ops.py _KERNEL_HEAD_DIMS
# Tests whose body fixes causal=True (no causal parameter); forward-only tests (no backward kernel).
CAUSAL_TESTS = {"test_flash_attn_causal", "test_flash_attn_varlen_causal"}
FORWARD_ONLY_TESTS = {"test_flash_attn_kvcache"}
_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}


# The pytest.skip() calls at the top of test bodies that depend on parameters only (upstream's
# test_flash_attn_v26.py): such cases would only report "skipped".
BODY_SKIPS = {
    "test_flash_attn_kvcache": lambda p: (
        (p["seqlen_q"] > p["seqlen_k"] and p["new_kv"]) or (not p["new_kv"] and p["rotary_fraction"] > 0.0)
        or ((p.get("has_batch_idx") or p.get("has_leftpad")) and p.get("paged_kv_block_size") is not None)),
    "test_flash_attn_output": lambda p: p.get("softcap", 0.0) > 0.0 and p.get("dropout_p", 0.0) > 0.0,
    "test_flash_attn_varlen_output": lambda p: p.get("softcap", 0.0) > 0.0 and p.get("dropout_p", 0.0) > 0.0,
}


def _allotment(sizes, cap, per_func_max):
    """How many cases each function keeps: the same fraction of each (at least one), with at most
    per_func_max (if any) a function and the cap spent on the others."""
    fixed, free = {}, dict(sizes)
    while free:
        budget = max(0, cap - sum(fixed.values()))
        frac = min(1.0, budget / max(1, sum(free.values())))
        over = {f: n for f, n in free.items() if per_func_max is not None and n * frac > per_func_max}
        if not over:
            break
        for f in over:
            fixed[f] = per_func_max
            del free[f]
    else:
        frac = 0.0
    out = {f: min(n, max(1, math.floor(n * frac))) for f, n in free.items()}
    out.update(fixed)
    return out


def _kernel_dim(d):
    return next((k for k in KERNEL_HEAD_DIMS if d <= k), None)


def _params(item):
    return getattr(getattr(item, "callspec", None), "params", {})


def _unconditional_skip(item):
    return any(m.name == "skip" for m in item.iter_markers())


def _built_kernels():
    """(fwd, bwd) kernel sets of the flash_attn_cute on the path, or None without its extension."""
    try:
        from flash_attn_cute import _ops
    except Exception:  # noqa: BLE001 (no package / no torch CUDA: nothing to filter by)
        return None
    if _ops._C is None:
        return None
    return _ops.BUILT_FWD_KERNELS, _ops.BUILT_BWD_KERNELS


def _needed_kernels(item, params, dtype):
    """The (dtype, kernel head dim, causal, variant) keys the test runs, forward and backward."""
    d = params.get("d")
    if d is None or dtype not in _DTYPE_NAMES:
        return (), ()
    causal = bool(params.get("causal", item.originalname in CAUSAL_TESTS))
    if params.get("dropout_p", 0.0):
        variant = "dropout"
    elif params.get("alibi") or params.get("softcap", 0.0) or (params.get("local") and not causal):
        variant = "mods"
    else:
        variant = "plain"
    key = (_DTYPE_NAMES[dtype], _kernel_dim(d), causal, variant)
    return (key,), (() if item.originalname in FORWARD_ONLY_TESTS else (key,))


def pytest_collection_modifyitems(session, config, items):
    dtype = getattr(torch, os.environ.get("FAC_DTYPE", "bfloat16"))
    retarget = os.environ.get("FAC_RETARGET", "auto") != "0"
    max_d = int(os.environ.get("FAC_MAX_D", "128"))
    min_d = int(os.environ.get("FAC_MIN_D", "0"))
    dims_env = os.environ.get("FAC_KERNEL_DIMS", "").strip()
    kernel_dims = {int(x) for x in dims_env.split(",") if x.strip()} if dims_env else None
    unskip = os.environ.get("FAC_UNSKIP", "0") == "1"
    built = _built_kernels() if os.environ.get("FAC_BUILT_ONLY", "1") == "1" else None
    cap = int(os.environ.get("FAC_MAX_TESTS", "2400"))
    per_func_max = int(os.environ["FAC_PER_FUNC_MAX"]) if os.environ.get("FAC_PER_FUNC_MAX") else None

    # Functions with no case of the wanted dtype: their float16 cases run as `dtype` (FAC_RETARGET).
    has_dtype = {}
    for item in items:
        has_dtype.setdefault(item.originalname, False)
        if _params(item).get("dtype") == dtype:
            has_dtype[item.originalname] = True

    def run_dtype(item):
        got = _params(item).get("dtype")
        if got == dtype:
            return dtype
        if retarget and got == torch.float16 and not has_dtype[item.originalname]:
            return dtype
        return None

    def head_dim_ok(params):
        d = params.get("d")
        if d is None:
            return kernel_dims is None or 128 in kernel_dims
        if not min_d <= d <= max_d:
            return False
        return kernel_dims is None or _kernel_dim(d) in kernel_dims

    missing_kernel = 0

    funcs_env = os.environ.get("FAC_FUNCS", "").strip()
    funcs = {f.strip() for f in funcs_env.split(",") if f.strip()} if funcs_env else None

    def eligible(item):
        nonlocal missing_kernel
        if funcs is not None and item.originalname not in funcs:
            return False
        params = _params(item)
        if run_dtype(item) is None or not head_dim_ok(params):
            return False
        if _unconditional_skip(item) and not unskip:
            return False
        body_skip = BODY_SKIPS.get(item.originalname)
        if body_skip is not None and body_skip(params):
            return False
        if built is not None:
            fwd, bwd = _needed_kernels(item, params, dtype)
            if any(k not in built[0] for k in fwd) or any(k not in built[1] for k in bwd):
                missing_kernel += 1
                return False
        return True

    keep = [item for item in items if eligible(item)]
    by_func = {}
    for item in keep:
        by_func.setdefault(item.originalname, []).append(item)
    allot = _allotment({f: len(g) for f, g in by_func.items()}, cap, per_func_max)
    chosen = set()
    for name, group in by_func.items():
        group = sorted(group, key=lambda it: hashlib.sha1(it.nodeid.encode()).hexdigest())
        chosen.update(it.nodeid for it in group[:allot[name]])
    selected = [item for item in items if item.nodeid in chosen]  # original (collection) order
    deselected = [item for item in items if item.nodeid not in chosen]
    for item in selected:
        params = _params(item)
        if params.get("dtype") != dtype:  # FAC_RETARGET: run this float16 case as `dtype`
            object.__setattr__(item.callspec, "params", {**params, "dtype": dtype})
        if unskip:
            item.own_markers[:] = [m for m in item.own_markers if m.name != "skip"]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    items[:] = selected

    counts = {}
    for item in selected:
        counts[item.originalname] = counts.get(item.originalname, 0) + 1
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(
            f"subset_select: dtype={dtype} kernel_dims={sorted(kernel_dims) if kernel_dims else 'any'} "
            f"d in [{min_d}, {max_d}] unskip={int(unskip)} built_filter={'on' if built else 'off'} "
            f"(dropped for missing kernels: {missing_kernel}); eligible {len(keep)} of {len(items) + len(deselected)}"
            f", kept {len(selected)} (cap {cap}, per function {per_func_max})")
        for name, n in counts.items():
            reporter.write_line(f"subset_select:   {name}: {n} of {len(by_func[name])}")
    path = os.environ.get("FAC_SELECTED")
    if path:
        with open(path, "w") as f:
            f.writelines(item.nodeid + "\n" for item in selected)
