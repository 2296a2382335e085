"""STAND-IN for slime's `tools/convert_torch_dist_to_hf.py` (single process, CPU).

    python convert_torch_dist_to_hf.py --input-dir <save>/iter_N --output-dir OUT \
        --origin-hf-dir ORIG [--vocab-size V] [-f]

It reads the demo torch_dist checkpoint (checking every distcp shard against .metadata,
so a partial save is refused) and writes the same HF safetensors layout that
`slime_train.py --save-hf` writes for that iteration, byte for byte: the index FIRST, then
`model-0000i-of-0000N.safetensors`, then config.json (copied from ORIG, like the real tool
copies config and tokenizer files; a built-in Qwen-like config when ORIG has none), plus
ORIG's tokenizer files. Like the real tool it writes OUT in place and refuses an existing
OUT without -f.

Exit codes: 0 written; 1 bad or partial input, existing OUT without -f, write error;
2 usage error.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import _common as c

PROG = "convert_torch_dist_to_hf"


def main() -> int:
    p = argparse.ArgumentParser(prog=PROG, description="slime torch_dist -> HF converter stand-in (demo)")
    p.add_argument("--input-dir", required=True)
    p.add_argument("--output-dir", required=True)
    p.add_argument("--origin-hf-dir", required=True)
    p.add_argument("--vocab-size", type=int)
    p.add_argument("-f", "--force", action="store_true")
    args = p.parse_args(sys.argv[1:])
    out = Path(args.output_dir)
    if out.exists() and not args.force:
        raise c.DemoError(f"output dir {out} already exists; pass -f to overwrite")
    origin = Path(args.origin_hf_dir)
    if not origin.is_dir():
        raise c.DemoError(f"--origin-hf-dir {origin} is not a directory")
    ckpt = c.load_checkpoint(args.input_dir)
    common = ckpt["common"]
    hf_bytes = int(common.get("hf_bytes", 256 << 10))
    c.write_hf_dir(out, ckpt["weights_digest"], hf_bytes, c.hf_config_from(origin))
    for extra in sorted(origin.glob("tokenizer*")) + sorted(origin.glob("generation_config.json")):
        if extra.is_file():
            shutil.copyfile(extra, out / extra.name)
    print(f"converted iteration {common.get('iteration')} from {args.input_dir} to {out}", flush=True)
    return 0


if __name__ == "__main__":
    c.run_main(PROG, main)
