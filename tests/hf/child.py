"""One process of a cross-process test: builds a tiny model, runs
KvdepotHF.generate on a prompt against a store directory, and writes what
it saw as JSON (tokens, restored count, failed blocks, worker stats) plus
the prompt's KV (the cache after generate) and the restored staging tensor
to files next to it.

usage: child.py FAMILY PROMPT_LEN PROMPT_SEED STORE_DIR OUT_PREFIX [CODEC]"""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import models  # noqa: E402
from kvdepot.hf import KvdepotHF  # noqa: E402


def main():
    family, n, seed, store, out = sys.argv[1:6]
    codec = sys.argv[6] if len(sys.argv) > 6 else "raw"
    m = models.build(family)
    ids = models.prompt(int(n), int(seed))
    cold = m.generate(ids, max_new_tokens=8, do_sample=False,
                      attention_mask=torch.ones_like(ids))
    with KvdepotHF(m, block_size=16, codec=codec, store_dir=store,
                   arena_size="64m", disk_size="64m",
                   disk_write="through") as kv:
        from transformers import DynamicCache
        cache = DynamicCache(config=m.config)
        m(ids, past_key_values=cache)  # the prompt's own KV, for the bytes
        kvs = torch.stack([torch.stack([cache.layers[i].keys[0],
                                        cache.layers[i].values[0]])
                           for i in range(len(cache.layers))])
        got = kv.generate(ids, max_new_tokens=8, do_sample=False)
        r = kv.last
        torch.save({"kv": kvs, "staging": r.staging}, out + ".pt")
        res = {"cold": cold[0, ids.shape[1]:].tolist(),
               "got": got[0, ids.shape[1]:].tolist(),
               "restored": r.tokens, "matched": r.matched,
               "failed": r.failed, "stats": kv.stats()}
    Path(out + ".json").write_text(json.dumps(res))


if __name__ == "__main__":
    main()
