#!/usr/bin/env python3
"""Prints the per-kernel resources of AMD artifacts as a Markdown table: threads per
block, VGPRs, SGPRs, LDS, scratch and spills, and the occupancy (waves per SIMD) LLVM
computed for them, as strata-compile recorded them in manifest.toml.

    scripts/amd-occupancy.py ARTIFACTS_DIR
"""
import sys
import tomllib

manifest = tomllib.load(open(f"{sys.argv[1]}/manifest.toml", "rb"))
target = manifest["target"]
print(f"{target['name']} (wave {target['wave_size']}), {len(manifest['kernels'])} kernels, "
      f"pack {manifest['pack']['file']}, --spec {manifest['options'].get('spec', 0)}\n")
print("| kernel | threads | VGPRs | SGPRs | LDS bytes | scratch | spills | waves/SIMD |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for k in manifest["kernels"]:
    r = k["resources"]
    if r.get("source") != "code_object":
        sys.exit(f"{k['name']}: no code-object resources (not an AMD build)")
    spills = r["vgpr_spills"] + r["sgpr_spills"]
    print(f"| {k['name']} | {k['launch']['threads']} | {r['vgprs']} | {r['sgprs']} | {r['lds_bytes']} "
          f"| {r['scratch_bytes']} | {spills} | {r.get('occupancy', 0) or '?'} |")
