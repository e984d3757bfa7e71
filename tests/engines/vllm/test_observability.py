"""kvdepot's connector stats, Prometheus metrics and KV events against
vLLM's own classes (PyPI vLLM, CPU; `make test-vllm`): the stats go
through vLLM's KVConnectorLogging (build_kv_connector_stats, aggregate,
reduce), the metrics through vLLM's KVConnectorProm into a
prometheus_client CollectorRegistry, and a saved prompt comes out of
take_events as vLLM's BlockStored, which vLLM's KVEventBatch encodes.
"""

import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

vllm = pytest.importorskip("vllm")
prom = pytest.importorskip("prometheus_client")

from vllm.config import KVTransferConfig  # noqa: E402
from vllm.distributed.kv_events import (BlockRemoved, BlockStored,  # noqa
                                        KVEventBatch)
from vllm.distributed.kv_transfer.kv_connector.v1 import metrics  # noqa

from kvdepot import vllm as kv  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
import test_vllm_connector as tvc  # noqa: E402

KTC = KVTransferConfig(kv_connector="KvdepotConnector",
                       kv_connector_module_path="kvdepot.vllm",
                       kv_role="kv_both")


def test_stats_through_vllms_logging():
    assert issubclass(kv._vllm_obs.KvdepotConnectorStats,
                      metrics.KVConnectorStats)
    log = metrics.KVConnectorLogging(KTC)
    log.observe({"blocks_saved": 6, "bytes_saved": 600,
                 "load_wait_s": [0.002]})
    log.observe({"blocks_saved": 2, "hit_tokens": 32,
                 "load_wait_s": [0.004]})
    lines = []
    log.log(log_fn=lambda fmt, *a: lines.append(fmt % a))
    assert len(lines) == 1
    assert "blocks_saved=8" in lines[0] and "hit_tokens=32" in lines[0]
    assert "load_wait_avg_ms=3.0" in lines[0]


def test_prometheus_through_vllms_prom():
    reg = prom.CollectorRegistry()

    def bound(cls):
        def init(self, *a, **k):
            cls.__init__(self, *a, registry=reg, **k)
        return type(cls.__name__, (cls,), {"__init__": init})

    class Prom(metrics.KVConnectorProm):
        _gauge_cls = bound(prom.Gauge)
        _counter_cls = bound(prom.Counter)
        _histogram_cls = bound(prom.Histogram)

    p = Prom(NS(kv_transfer_config=KTC), ["model_name", "engine"],
             {0: ["tiny", "0"]})
    assert isinstance(p.prom_metrics, metrics.KVConnectorPromMetrics)
    p.observe({"blocks_loaded": 5, "hit_tokens": 80,
               "load_wait_s": [0.01]}, 0)
    lab = {"model_name": "tiny", "engine": "0"}
    assert reg.get_sample_value("kvdepot_blocks_loaded_total", lab) == 5
    assert reg.get_sample_value("kvdepot_hit_tokens_total", lab) == 80
    assert reg.get_sample_value("kvdepot_load_wait_seconds_count", lab) == 1


def test_events_are_vllms():
    with tempfile.TemporaryDirectory() as d:
        cfg = tvc.vllm_config(d)
        cfg.kv_events_config = NS(enable_kv_cache_events=True)
        kvs = tvc.caches("flash", fill=True)
        s, w, names = tvc.connector_pair(cfg, kvs)
        tokens = [(i * 13 + 5) % 32000 for i in range(tvc.PROMPT)]
        req = tvc.Request("a", tokens)
        s.get_num_new_matched_tokens(req, 0)
        s.update_state_after_alloc(req, tvc.Blocks(range(7)), 0)
        meta = s.build_connector_meta(tvc.sched_output(
            new=[(req, 0)], tokens={"a": tvc.PROMPT}))
        s.update_connector_output(tvc.worker_step(w, meta, kvs, names))
        events = list(s.take_events())
        assert len(events) == 1 and type(events[0]) is BlockStored
        e = events[0]
        assert len(e.block_hashes) == 6 and e.token_ids == tokens[:96]
        # The publisher's encoding accepts them.
        import msgspec
        raw = msgspec.msgpack.encode(KVEventBatch(ts=0.0, events=events))
        back = msgspec.msgpack.decode(raw, type=KVEventBatch)
        assert list(back.events[0].block_hashes) == e.block_hashes
        s.store.flush()
        s.store.delete(s.ns, e.block_hashes[:1])
        gone = list(s.take_events())
        assert [type(x) for x in gone] == [BlockRemoved]
        s.shutdown()
        w.shutdown()


@pytest.mark.skipif(not tvc.KVDEPOTD, reason="KVDEPOTD not set")
def test_events_from_a_daemon_are_vllms(tmp_path):
    """Daemon mode: the daemon's store commits and deletes reach take_events
    as vLLM's BlockStored and BlockRemoved."""
    proc = tvc.start_daemon(tmp_path)[0]
    try:
        cfg = tvc.vllm_config("", store_mode="daemon",
                              store_address=f"unix:{tmp_path}/d.sock")
        cfg.kv_events_config = NS(enable_kv_cache_events=True)
        kvs = tvc.caches("flash", fill=True)
        s, w, names = tvc.connector_pair(cfg, kvs)
        tokens = [(i * 7 + 11) % 32000 for i in range(tvc.PROMPT)]
        req = tvc.Request("d", tokens)
        s.get_num_new_matched_tokens(req, 0)
        s.update_state_after_alloc(req, tvc.Blocks(range(7)), 0)
        meta = s.build_connector_meta(tvc.sched_output(
            new=[(req, 0)], tokens={"d": tvc.PROMPT}))
        s.update_connector_output(tvc.worker_step(w, meta, kvs, names))
        events = list(s.take_events())
        assert [type(x) for x in events] == [BlockStored]
        hashes = events[0].block_hashes
        assert len(hashes) == 6
        assert s.store.delete(s.ns, hashes[:2]) == 2
        gone = list(s.take_events())
        assert [type(x) for x in gone] == [BlockRemoved, BlockRemoved]
        assert [h for x in gone for h in x.block_hashes] == hashes[:2]
        s.shutdown()
        w.shutdown()
    finally:
        tvc.stop_daemon(proc)
