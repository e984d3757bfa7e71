"""One process of a tensor-parallel engine for test_vllm_spawn.py: a
kvdepot.vllm connector (either role) in a process of its own, as vLLM
runs each worker rank. Commands arrive as JSON lines on stdin; each answer
is one stdout line starting with "@@ " (other output is the libraries').
Binary values (connector metadata, worker outputs, KV bytes) travel as
base64 pickles.

  open      {role, rank, tp, instance_id, extra, fill, seed}
            -> {pid, started, address} of the connector's kvdepotd
  step      {meta}  -> {out}: the worker's side of one step
  blocks    {ids}   -> {data}: the KV of those blocks, every layer
  stats     -> the worker's counters
  shutdown  -> {}: the connector shuts down (the process stays)
"""

import base64
import json
import pickle
import sys
import traceback

import torch

import test_vllm_connector as t
from kvdepot import vllm as kv


def b64(obj):
    return base64.b64encode(pickle.dumps(obj)).decode()


def unb64(text):
    return pickle.loads(base64.b64decode(text))


def config(c):
    cfg = t.vllm_config(c["extra"].pop("store_dir", ""), **c["extra"])
    cfg.parallel_config.tensor_parallel_size = c["tp"]
    cfg.parallel_config.rank = c["rank"]
    cfg.instance_id = c["instance_id"]
    return cfg


def main():
    conn, kvs = None, None
    for line in sys.stdin:
        c = json.loads(line)
        try:
            if c["cmd"] == "open":
                role = kv.KVConnectorRole[c["role"].upper()]
                conn = kv.KvdepotConnector(config(c), role)
                if role == kv.KVConnectorRole.WORKER:
                    torch.manual_seed(c["seed"])
                    kvs = t.caches("flash", fill=c["fill"])
                    if c["fill"]:  # a different shard per rank
                        for x in kvs.values():
                            x.copy_(torch.randn(x.shape).to(torch.float16))
                    conn.register_kv_caches(kvs)
                d = conn.daemon
                out = {"pid": d.pid, "started": d.started,
                       "address": d.address}
            elif c["cmd"] == "step":
                out = {"out": b64(t.worker_step(conn, unb64(c["meta"]), kvs,
                                                list(kvs)))}
            elif c["cmd"] == "blocks":
                data = b"".join(x[:, b].contiguous().numpy().tobytes()
                                for x in kvs.values() for b in c["ids"])
                out = {"data": base64.b64encode(data).decode()}
            elif c["cmd"] == "stats":
                out = conn.kvdepot_stats()
            elif c["cmd"] == "shutdown":
                conn.shutdown()
                conn, out = None, {}
            else:
                out = {"error": f"unknown command {c['cmd']}"}
        except Exception:
            out = {"error": traceback.format_exc()}
        sys.stdout.write("@@ " + json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
