"""The build helper's prebuilt-object keys (csrc/features.py, CPU only): an object depends on its
source and on the kernel headers it includes, so editing the backward's headers leaves the forward's
objects valid and the other way round, while any edit to a header an object includes invalidates it."""
import shutil

import pytest


def _instance(features, tmp_path, pass_):
    """A generated-style instantiation source of pass_ ('fwd' or 'bwd')."""
    path = tmp_path / f"{pass_}_instance.cu"
    path.write_text(features.INSTANCE_TEMPLATE.format(
        p=pass_, P=pass_.capitalize(), dtype="kBFloat16", hdim=128, causal="false", even_k="true",
        variant="kPlain"))
    return path


def test_kernel_headers_follow_includes(features, tmp_path):
    fwd = {p.name for p in features.kernel_headers(_instance(features, tmp_path, "fwd"))}
    bwd = {p.name for p in features.kernel_headers(_instance(features, tmp_path, "bwd"))}
    assert {"fwd_launch.h", "fwd_kernel.h", "softmax.h", "params.h"} <= fwd
    assert {"bwd_launch.h", "bwd_kernel.h", "bwd_epilogue.h", "bwd_preprocess.h", "params.h"} <= bwd
    assert not any(name.startswith("bwd_") for name in fwd), fwd
    assert not any(name.startswith("fwd_") for name in bwd), bwd


def test_prebuilt_key_tracks_included_headers(features, tmp_path, monkeypatch):
    if features.find_cutlass_include()[0] is None:
        pytest.skip("CuTe headers not found: `pip install nvidia-cutlass==4.2.0.0` or set CUTLASS_PATH")
    root = tmp_path / "root"
    shutil.copytree(features.ROOT / "include", root / "include")
    monkeypatch.setattr(features, "ROOT", root)
    fwd, bwd = _instance(features, tmp_path, "fwd"), _instance(features, tmp_path, "bwd")

    def keys():
        return features.prebuilt_key(fwd, ["90"], "13.0"), features.prebuilt_key(bwd, ["90"], "13.0")

    def touch(header):
        path = root / "include" / "flash_attn_cute" / header
        path.write_text(path.read_text() + "\n// edited\n")

    fwd_key, bwd_key = keys()
    touch("bwd_epilogue.h")
    new_fwd, new_bwd = keys()
    assert new_fwd == fwd_key and new_bwd != bwd_key, "a backward header edit changes the bwd keys only"
    touch("fwd_kernel.h")
    newer_fwd, newer_bwd = keys()
    assert newer_fwd != new_fwd and newer_bwd == new_bwd, "a forward header edit changes the fwd keys only"
    touch("params.h")
    last_fwd, last_bwd = keys()
    assert last_fwd != newer_fwd and last_bwd != newer_bwd, "a shared header edit changes both"
    assert features.prebuilt_key(fwd, ["80", "90"], "13.0") != last_fwd, "the archs are part of the key"
