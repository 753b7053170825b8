"""The build helper's prebuilt-object keys (csrc/features.py, CPU only): an object depends on its
source and on the kernel headers it includes, so editing the backward's headers leaves the forward's
objects valid and the other way round, while any edit to a header an object includes invalidates it."""
import re
import shutil

import pytest


def _instance(features, tmp_path, pass_):
    """A generated-style instantiation source of pass_ ('fwd' or 'bwd')."""
    path = tmp_path / f"{pass_}_instance.cu"
    path.write_text(features.source_text(pass_, [("bf16", 128, False, True, "plain")]))
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


@pytest.mark.parametrize("dropout", ["1", "0"])
def test_generated_sources_hold_each_listed_instantiation_once(features, tmp_path, monkeypatch, dropout):
    """Every instantiation the dispatchers list (<pass>_instances.h) is compiled by exactly one generated
    file, one file per (pass, dtype, head dim, variant) (the Hopper score-mod forward's two)."""
    monkeypatch.setattr(features, "GENERATED", tmp_path)
    for name in ("FLASH_ATTN_CUTE_PASSES", "FLASH_ATTN_CUTE_SCORE_MODS", "FLASH_ATTN_CUTE_ARCHS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLASH_ATTN_CUTE_DTYPES", "bf16,fp16")
    monkeypatch.setenv("FLASH_ATTN_CUTE_HDIMS", "64,256")
    monkeypatch.setenv("FLASH_ATTN_CUTE_DROPOUT", dropout)
    variants = 3 if dropout == "1" else 2
    sources = [s for s in features.generate() if s.parent == tmp_path]
    sm90 = [s for s in sources if s.name.startswith("fwd_sm90_")]
    bwd_sm90 = [s for s in sources if s.name.startswith("bwd_sm90_")]
    bwd_small = [s for s in sources if s.name.startswith("bwd_small_")]
    fwd_small = [s for s in sources if s.name.startswith("fwd_small_")]
    assert len(sources) - len(sm90) - len(bwd_sm90) - len(bwd_small) - len(fwd_small) == 2 * 2 * 2 * variants, sorted(
        s.name for s in sources)
    # The small tiles (the default archs include 80): the backward's files again, the forward's at
    # head dim 256 (FWD_SMALL).
    assert len(bwd_small) == 2 * 2 * variants
    assert sorted(s.name for s in fwd_small) == sorted(
        f"fwd_small_{d}_hdim256{v}.cu" for d in ("bf16", "fp16") for v in ("", "_mods", "_dropout")[:variants])
    # The Hopper backward: every variant, both head dims built here, per dtype.
    assert sorted(s.name for s in bwd_sm90) == sorted(
        f"bwd_sm90_{d}_hdim{h}{v}.cu" for d in ("bf16", "fp16") for h in (64, 256)
        for v in ("", "_mods", "_dropout")[:variants])
    for pass_ in ("fwd", "bwd"):
        compiled = []
        for src in sources:
            if src.name.startswith(pass_ + "_") and src not in sm90 + bwd_sm90 + bwd_small + fwd_small:
                found = re.findall(rf"run_{pass_}<DType::(\w+), (\d+), (\w+), (\w+), Variant::(\w+)>", src.read_text())
                assert len(found) == len(features.CAUSAL) * len(features.EVEN_K), src.name
                compiled += found
        listed = re.findall(r"X\((\w+), (\d+), (\w+), (\w+), (\w+)\)", (tmp_path / f"{pass_}_instances.h").read_text())
        assert len(set(compiled)) == len(compiled) == 2 * 2 * 4 * variants
        assert sorted(compiled) == sorted(listed)
        assert ("kDropout" in {v for *_, v in compiled}) == (dropout == "1")
    # The Hopper forward (default archs include 90): one file per (dtype, head dim, variant), the
    # score-mod one split into a non-causal and a causal file (SPLIT_BY_CAUSAL), every variant at
    # every head dim (at 256 the score-mod and dropout files hold the warp-specialized kernel only:
    # tile_size.h's fwd_sm90_ws_only).
    assert len(sm90) == 2 * 2 * (variants + 1)
    per_file = {src.name: re.findall(r"run_fwd_sm90<DType::(\w+), (\d+), (\w+), (\w+), Variant::(\w+)>",
                                     src.read_text()) for src in sm90}
    group = len(features.CAUSAL) * len(features.EVEN_K)
    assert ("fwd_sm90", "mods") in features.SPLIT_BY_CAUSAL
    for name, found in per_file.items():
        if "_mods" in name:  # the causal instantiations in the "_causal" file, the others in the other
            assert {c for _, _, c, _, _ in found} == {"true" if name.endswith("_causal.cu") else "false"}, name
        assert len(found) == (group // len(features.CAUSAL) if "_mods" in name else group), name
    compiled = [m for found in per_file.values() for m in found]
    listed = re.findall(r"X\((\w+), (\d+), (\w+), (\w+), (\w+)\)", (tmp_path / "fwd_sm90_instances.h").read_text())
    assert len(set(compiled)) == len(compiled) == 2 * 2 * 4 * variants and sorted(compiled) == sorted(listed)
    assert "kScoreMods" in {v for _, h, _, _, v in compiled if int(h) == 256}
    assert ("kDropout" in {v for _, h, _, _, v in compiled if int(h) == 256}) == (dropout == "1")


@pytest.mark.parametrize("archs, small, built, every_arch", [
    ("90", "auto", False, False), ("80,90", "auto", True, False), ("86", "auto", True, False),
    ("90", "1", True, True), ("80", "0", False, False)])
def test_small_tiles_built_for_archs_below_90(features, tmp_path, monkeypatch, archs, small, built, every_arch):
    """FLASH_ATTN_CUTE_SMALL_SMEM: by default the small-tile kernels are built where an arch below 90
    is (their sm_90 code traps: Hopper never takes them); 1 builds them for every arch (the tests force
    them on Hopper), 0 not at all. The backward's instantiations are the backward's, the forward's
    those of head dim 256 without causal masking."""
    monkeypatch.setattr(features, "GENERATED", tmp_path)
    monkeypatch.setenv("FLASH_ATTN_CUTE_ARCHS", archs)
    monkeypatch.setenv("FLASH_ATTN_CUTE_HDIMS", "128,256")
    monkeypatch.setenv("FLASH_ATTN_CUTE_DTYPES", "bf16")
    monkeypatch.setenv("FLASH_ATTN_CUTE_SMALL_SMEM", small)
    monkeypatch.delenv("FLASH_ATTN_CUTE_PASSES", raising=False)
    monkeypatch.setenv("FLASH_ATTN_CUTE_SCORE_MODS", "1")
    monkeypatch.setenv("FLASH_ATTN_CUTE_DROPOUT", "0")
    generated = [s for s in features.generate() if s.parent == tmp_path]
    sources = [s for s in generated if s.name.startswith("bwd_small_")]
    assert len(sources) == (4 if built else 0)
    entry = r"X\((\w+), (\d+), (\w+), (\w+), (\w+)\)"
    header = (tmp_path / "bwd_small_instances.h").read_text()
    bwd = re.findall(entry, (tmp_path / "bwd_instances.h").read_text())
    assert sorted(re.findall(entry, header)) == (sorted(bwd) if built else [])
    fwd_header = (tmp_path / "fwd_small_instances.h").read_text()
    fwd_256_full = [i for i in re.findall(entry, (tmp_path / "fwd_instances.h").read_text()) if i[1:3] == ("256", "false")]
    assert len(fwd_256_full) == 4 and sorted(re.findall(entry, fwd_header)) == (sorted(fwd_256_full) if built else [])
    for text in (header, fwd_header):
        assert f"#define FLASH_SMALL_SMEM_EVERY_ARCH {int(every_arch)}" in text
    for src in sources:
        text = src.read_text()
        assert ("#define FLASH_ATTN_CUTE_SMALL_SMEM_EVERY_ARCH" in text) == every_arch, src.name
        assert len(re.findall(r"run_bwd_small<", text)) == len(features.CAUSAL) * len(features.EVEN_K), src.name
    fwd_sources = [s for s in generated if s.name.startswith("fwd_small_")]
    assert len(fwd_sources) == (2 if built else 0)
    for src in fwd_sources:
        assert len(re.findall(r"run_fwd_small<DType::kBFloat16, 256, false,", src.read_text())) == 2, src.name
    monkeypatch.setenv("FLASH_ATTN_CUTE_SMALL_SMEM", "yes")
    with pytest.raises(ValueError, match="FLASH_ATTN_CUTE_SMALL_SMEM"):
        features.generate()


@pytest.mark.parametrize("archs, sm90", [("80", False), ("90", True), ("80,90", True)])
def test_hopper_forward_built_only_for_arch_90(features, tmp_path, monkeypatch, archs, sm90):
    """Arch 90 compiles as sm_90a (the warpgroup MMAs need it) and adds the Hopper forward's files;
    an sm_80-only build has none and an empty instance list."""
    monkeypatch.setattr(features, "GENERATED", tmp_path)
    monkeypatch.setenv("FLASH_ATTN_CUTE_ARCHS", archs)
    monkeypatch.setenv("FLASH_ATTN_CUTE_HDIMS", "128")
    monkeypatch.setenv("FLASH_ATTN_CUTE_DTYPES", "bf16")
    monkeypatch.delenv("FLASH_ATTN_CUTE_PASSES", raising=False)
    monkeypatch.setenv("FLASH_ATTN_CUTE_SCORE_MODS", "1")
    monkeypatch.setenv("FLASH_ATTN_CUTE_DROPOUT", "0")
    names = {s.name for s in features.generate() if s.parent == tmp_path}
    assert ("fwd_sm90_bf16_hdim128.cu" in names) == sm90 and ("fwd_sm90_bf16_hdim128_mods.cu" in names) == sm90
    listed = re.findall(r"X\(", (tmp_path / "fwd_sm90_instances.h").read_text())
    assert len(listed) == (8 if sm90 else 0)
    flags = features.nvcc_gencode_flags(archs.split(","))
    assert ("-gencode=arch=compute_90a,code=sm_90a" in flags) == sm90
    assert not any(f.endswith("code=sm_90") for f in flags)


def test_default_max_jobs_fits_memory(features):
    gib = 1 << 30
    assert features.default_max_jobs(16, 128 * gib) == 16
    assert features.default_max_jobs(64, 100 * gib) == 25
    assert features.default_max_jobs(8, 3 * gib) == 1
    assert features.default_max_jobs(4, None) == 4
    available = features.mem_available_bytes()
    assert available is None or available > 0


def test_compile_order_starts_the_longest_files_first(features, tmp_path, monkeypatch):
    """Every generated file of a whole build has a compile-time estimate by its kind and variant (none
    falls back to the glue's), and compile_order sorts by it, longest first, whatever order it gets."""
    monkeypatch.setattr(features, "GENERATED", tmp_path)
    monkeypatch.setenv("FLASH_ATTN_CUTE_ARCHS", "80,90")
    monkeypatch.setenv("FLASH_ATTN_CUTE_SMALL_SMEM", "1")
    for name in ("HDIMS", "DTYPES", "PASSES", "SCORE_MODS", "DROPOUT"):
        monkeypatch.delenv(f"FLASH_ATTN_CUTE_{name}", raising=False)
    sources = features.generate()
    generated = [s for s in sources if s.parent == tmp_path]
    groups = {s.name: features.source_group(s) for s in generated}
    assert {group[0] for group in groups.values()} == set(features.KINDS)
    for name, group in groups.items():
        assert group[:2] in features.COMPILE_SECONDS, name
    order = features.compile_order(sources)
    assert sorted(order) == sorted(sources) and order == features.compile_order(order[::-1])
    seconds = [features.compile_seconds(s) for s in order]
    assert seconds == sorted(seconds, reverse=True)
    assert order[0].name.startswith("fwd_sm90_") and order[0].stem.endswith("_dropout")
    assert features.compile_seconds(tmp_path / "fwd_sm90_bf16_hdim32_dropout.cu") < features.compile_seconds(
        tmp_path / "fwd_sm90_bf16_hdim64_dropout.cu")
