"""kvdepot.vllm's connector stats, Prometheus metrics and KV events, over
the stand-ins for vLLM's classes (no vLLM needed), with real torch CPU
tensors, the host backend and the embedded store: counters per interval
from the workers and the scheduler, aggregated and rebuilt from a dict as
vLLM's logger does, observed into a prometheus_client registry, and
BlockStored after a save, BlockRemoved after an eviction or a delete,
in an embedded store and through a kvdepotd (daemon mode).
"""

import tempfile
import time

import pytest

torch = pytest.importorskip("torch")

from test_vllm_connector import (BS, DIM, HEADS, LAYERS, PROMPT, Blocks,  # noqa: E402,E501
                                 Request, caches, connector_pair,
                                 sched_output, vllm_config, worker_step)
from kvdepot import _lib, _vllm_obs, vllm as kv  # noqa: E402
from conftest import KVDEPOTD, start_daemon, stop_daemon  # noqa: E402

OBJ_TOKENS = 96  # the 6 full blocks of a PROMPT-token prompt


def prompt(seed):
    return [(i * 31 + seed * 101 + 7) % 32000 for i in range(PROMPT)]


def compute(s, w, kvs, names, rid, tokens, blocks):
    """One request computed from scratch, its full blocks saved."""
    req = Request(rid, tokens)
    n, _ = s.get_num_new_matched_tokens(req, 0)
    s.update_state_after_alloc(req, Blocks(blocks), 0)
    meta = s.build_connector_meta(sched_output(new=[(req, 0)],
                                               tokens={rid: PROMPT}))
    s.update_connector_output(worker_step(w, meta, kvs, names))
    s.request_finished(req, blocks)
    return n


def test_stats_aggregate_reduce_and_rebuild():
    a = _vllm_obs.KvdepotConnectorStats()
    assert a.is_empty()
    a.add({"blocks_saved": 6, "bytes_saved": 600, "promotions": 9})
    a.sample(0.002)
    b = kv.KvdepotConnector.build_kv_connector_stats(
        {"blocks_saved": 2, "hit_tokens": 32, "load_wait_s": [0.004]})
    assert isinstance(b, _vllm_obs.KvdepotConnectorStats)
    a = a.aggregate(b)
    assert a.data["blocks_saved"] == 8 and a.data["hit_tokens"] == 32
    assert a.data["load_wait_s"] == [0.002, 0.004]
    r = a.reduce()
    assert r["blocks_saved"] == 8 and r["bytes_saved"] == 600
    assert r["load_wait_avg_ms"] == 3.0
    # The dict crosses processes: rebuilt, it is the same.
    c = kv.KvdepotConnector.build_kv_connector_stats(dict(a.data))
    assert c.data == a.data and not c.is_empty()
    a.reset()
    assert a.is_empty()
    for bad in ({"blocks_saved": -1}, {"hit_tokens": "3"},
                {"load_wait_s": [1, "x"]}, ["blocks_saved"]):
        with pytest.raises(ValueError, match="kvdepot: connector stat"):
            kv.KvdepotConnector.build_kv_connector_stats(bad)


def test_interval_stats_from_workers_and_scheduler():
    with tempfile.TemporaryDirectory() as d:
        cfg = vllm_config(d)
        kvs = caches("flash", fill=True)
        s, w, names = connector_pair(cfg, kvs)
        tokens = prompt(1)
        assert compute(s, w, kvs, names, "a", tokens, range(7)) == 0
        ws = w.get_kv_connector_stats()
        assert ws.data["blocks_saved"] == 6
        assert ws.data["bytes_saved"] > 0
        assert w.get_kv_connector_stats() is None  # the interval was reset
        ss = s.get_kv_connector_stats()
        assert ss.data["lookup_tokens"] == PROMPT
        assert ss.data["hit_tokens"] == 0
        # The same prompt again: 96 tokens from the store.
        req = Request("b", tokens)
        n, _ = s.get_num_new_matched_tokens(req, 0)
        assert n == OBJ_TOKENS
        s.update_state_after_alloc(req, Blocks(range(7, 14)), n)
        meta = s.build_connector_meta(sched_output(new=[(req, n)],
                                                   tokens={"b": PROMPT - n}))
        s.update_connector_output(worker_step(w, meta, kvs, names))
        ws = w.get_kv_connector_stats()
        assert ws.data["blocks_loaded"] == 6
        assert len(ws.data["load_wait_s"]) == 1
        ss = s.get_kv_connector_stats()
        assert ss.data["hit_tokens"] == OBJ_TOKENS
        assert ss.data["hit_requests"] == 1
        # What vLLM's scheduler does with both: one object for the logger.
        total = kv.KvdepotConnector.build_kv_connector_stats(
            ws.aggregate(ss).data)
        assert total.reduce()["hit_tokens"] == OBJ_TOKENS
        # Embedded use without vLLM's logger: the totals since start.
        assert s.kvdepot_stats()["hit_tokens"] == OBJ_TOKENS
        assert s.kvdepot_stats()["lookup_tokens"] == 2 * PROMPT
        assert w.kvdepot_stats()["blocks_saved"] == 6
        s.shutdown()
        w.shutdown()


def test_gate_decisions_counted():
    """The recompute-vs-fetch gate from kv_connector_extra_config: an
    engine said to prefill a billion tokens a second computes the stored
    prefix (loading it cannot win) and counts it skipped; one at a thousand
    loads it and counts it loaded; a gate setting that does not exist is
    refused by name."""
    for rate, hit in ((1e9, 0), (1000.0, OBJ_TOKENS)):
        with tempfile.TemporaryDirectory() as d:
            cfg = vllm_config(d, gate={"prefill_tokens_per_s": rate})
            kvs = caches("flash", fill=True)
            s, w, names = connector_pair(cfg, kvs)
            tokens = prompt(3)
            assert compute(s, w, kvs, names, "a", tokens, range(7)) == 0
            s.get_kv_connector_stats()
            n, _ = s.get_num_new_matched_tokens(Request("b", tokens), 0)
            assert n == hit
            ss = s.get_kv_connector_stats()
            assert ss.data["gate_loaded"] == hit // BS
            assert ss.data["gate_skipped"] == 6 - hit // BS
            s.shutdown()
            w.shutdown()
    with pytest.raises(ValueError, match="unknown gate key"):
        kv.config.parse({"gate": {"prefill_tokens_per_s": 1.0,
                                  "disk_speed": 2}})
    with pytest.raises(ValueError, match="prefill_tokens_per_s"):
        kv.config.parse({"gate": {"margin": 0.5}})


def test_shed_saves_counted():
    """async_saves with room for one object in flight: a step saving six
    blocks reserves one and sheds five, whatever the timing (the bound
    counts the step's own reservations), and the stats say so."""
    # One stored object: K and V of every layer in fp16, then the header.
    obj = LAYERS * 2 * BS * HEADS * DIM * 2 + 128
    with tempfile.TemporaryDirectory() as d:
        kvs = caches("flash", fill=True)
        cfg = vllm_config(d, async_saves=True,
                          max_inflight_save_bytes=obj + obj // 2)
        s, w, names = connector_pair(cfg, kvs)
        compute(s, w, kvs, names, "a", prompt(5), range(7))
        for worker in w.workers:
            worker.flush_saves()
        st = w.kvdepot_stats()
        assert (st["blocks_saved"], st["saves_shed"]) == (1, 5), st
        ws = w.get_kv_connector_stats()
        assert ws.data["saves_shed"] == 5 and ws.data["blocks_saved"] == 1
        s.shutdown()
        w.shutdown()


def test_prometheus_metrics():
    prom = pytest.importorskip("prometheus_client")
    reg = prom.CollectorRegistry()

    def bound(cls):
        return type(cls.__name__, (cls,), {"__init__": lambda self, *a, **k:
                                            cls.__init__(self, *a,
                                                         registry=reg, **k)})

    types = {t: bound(t) for t in (prom.Gauge, prom.Counter, prom.Histogram)}
    m = kv.KvdepotConnector.build_prom_metrics(
        None, types, ["model_name", "engine"], {0: ["m", "0"], 1: ["m", "1"]})
    m.observe({"blocks_saved": 6, "hit_tokens": 96,
               "load_wait_s": [0.003, 0.2]}, engine_idx=1)
    m.observe({"blocks_saved": 1}, engine_idx=1)
    lab = {"model_name": "m", "engine": "1"}
    assert reg.get_sample_value("kvdepot_blocks_saved_total", lab) == 7
    assert reg.get_sample_value("kvdepot_hit_tokens_total", lab) == 96
    assert reg.get_sample_value("kvdepot_load_wait_seconds_count", lab) == 2
    assert reg.get_sample_value("kvdepot_blocks_saved_total",
                                {"model_name": "m", "engine": "0"}) == 0
    with pytest.raises(ValueError, match="kvdepot"):
        m.observe({"blocks_saved": "many"})


def test_no_events_unless_enabled():
    with tempfile.TemporaryDirectory() as d:
        kvs = caches("flash", fill=True)
        s, w, names = connector_pair(vllm_config(d), kvs)
        compute(s, w, kvs, names, "a", prompt(1), range(7))
        assert list(s.take_events()) == []
        s.shutdown()
        w.shutdown()


def stored(events):
    return [e for e in events if isinstance(e, _vllm_obs.BlockStored)]


def removed(events):
    return [h for e in events if isinstance(e, _vllm_obs.BlockRemoved)
            for h in e.block_hashes]


def test_events_after_save_and_delete():
    with tempfile.TemporaryDirectory() as d:
        kvs = caches("flash", fill=True)
        cfg = vllm_config(d)
        cfg.kv_events_config = NS_events(True)
        s, w, names = connector_pair(cfg, kvs)
        tokens = prompt(2)
        compute(s, w, kvs, names, "a", tokens, range(7))
        ev = s.take_events()
        st = stored(ev)
        assert len(st) == 1 and not removed(ev)
        e = st[0]
        assert len(e.block_hashes) == 6
        assert all(isinstance(h, bytes) and len(h) == 32
                   for h in e.block_hashes)
        assert e.parent_block_hash is None
        assert e.token_ids == tokens[:OBJ_TOKENS]
        assert e.block_size == BS and e.medium == "kvdepot"
        assert s.take_events() == []  # taken once
        # The same prompt saved again stores nothing new: no event.
        compute(s, w, kvs, names, "b", tokens, range(7, 14))
        assert stored(s.take_events()) == []
        # Deleting two blocks from the store: BlockRemoved for each.
        s.store.flush()  # write-through: the disk copies are written
        s.store.delete(s.ns, e.block_hashes[4:])
        assert sorted(removed(s.take_events())) == sorted(e.block_hashes[4:])
        # The prompt recomputed: blocks 4 and 5 are stored again, their
        # parent the 4th block.
        compute(s, w, kvs, names, "c", tokens, range(7))
        st = stored(s.take_events())
        assert [h for x in st for h in x.block_hashes] == e.block_hashes[4:]
        assert st[0].parent_block_hash == e.block_hashes[3]
        assert st[0].token_ids == tokens[4 * BS:OBJ_TOKENS]
        # A cache reset: the router forgets this node's blocks.
        s.reset_cache()
        assert any(isinstance(x, _vllm_obs.AllBlocksCleared)
                   for x in s.take_events())
        s.shutdown()
        w.shutdown()


def evict_by_saving(s, w, kvs, names, seed):
    """Saves 10 prompts of 6 blocks into a store that holds about 40 and
    collects the events: every block announced stored once, some removed
    again, each of those announced before. Returns (announced, gone)."""
    announced, gone = [], []
    for i in range(10):
        compute(s, w, kvs, names, f"r{i}", prompt(seed + i), range(7))
        ev = s.take_events()
        announced += [h for e in stored(ev) for h in e.block_hashes]
        gone += removed(ev)
    assert gone, "nothing evicted: the arena holds every prompt"
    assert set(gone) <= set(announced)
    assert len(set(announced)) == len(announced) == 60
    return announced, gone


def test_events_after_eviction():
    """A host arena without disk holding about 40 objects: saving 10
    prompts of 6 blocks evicts the first ones, which are then gone from
    the store: BlockRemoved, each for a block announced stored before."""
    with tempfile.TemporaryDirectory() as d:
        kvs = caches("flash", fill=True)
        cfg = vllm_config(d, kv_events=True)
        extra = cfg.kv_transfer_config.kv_connector_extra_config
        extra.update(store_dir="", arena_size="1m",
                     store_settings={"store.arena_chunk": "1m"})
        s, w, names = connector_pair(cfg, kvs)
        announced, gone = evict_by_saving(s, w, kvs, names, 10)
        # What was removed is no longer matched.
        first = announced[:6]
        assert first[0] in gone
        assert s.store.delete(s.ns, [first[0]]) == 0
        s.shutdown()
        w.shutdown()


@pytest.mark.skipif(not KVDEPOTD, reason="KVDEPOTD not set")
def test_events_from_the_daemons_store(tmp_path):
    """Daemon mode: the daemon's store evicts (a 1 MiB arena, no disk) and
    the connector reports it: BlockRemoved for blocks it announced, as in
    an embedded store; a delete by another client of the daemon is
    reported too (namespace filtering and tenants: test_service_admin.c,
    test_events)."""
    proc = start_daemon(tmp_path, "store.arena_size=1m",
                        "store.arena_chunk=1m")[0]
    try:
        kvs = caches("flash", fill=True)
        cfg = vllm_config("", store_mode="daemon", kv_events=True,
                          store_address=f"unix:{tmp_path}/d.sock")
        s, w, names = connector_pair(cfg, kvs)
        assert s._store_events  # the daemon sends its store's events
        announced, gone = evict_by_saving(s, w, kvs, names, 30)
        # Another client of the same daemon deletes a block this engine
        # stored.
        other = _lib.Store({"store.mode": "daemon",
                            "store.address": f"unix:{tmp_path}/d.sock"})
        try:
            last = announced[-1]
            assert other.delete(s.ns, [last]) == 1
        finally:
            other.close()
        assert removed(s.take_events()) == [last]
        # The daemon restarts (its event log numbered from 1 again; another
        # client starts it before this engine asks): the next save's blocks
        # are still announced, not skipped as numbers already read.
        stop_daemon(proc)
        proc = start_daemon(tmp_path, "store.arena_size=1m",
                            "store.arena_chunk=1m")[0]
        watcher = _lib.Store({"store.mode": "daemon",
                              "store.address": f"unix:{tmp_path}/d.sock"})
        try:
            watcher.events_watch([bytes(s.ns.bytes)])
            assert watcher.events_enable(8)
            saved = w.kvdepot_stats()["blocks_saved"]
            deadline, k = time.monotonic() + 20, 0
            while time.monotonic() < deadline:
                # the engine's client reconnects after a back-off
                compute(s, w, kvs, names, f"after-{k}", prompt(90 + k),
                        range(7))
                k += 1
                if w.kvdepot_stats()["blocks_saved"] > saved:
                    break
            stored_after = stored(s.take_events())
        finally:
            watcher.close()
        assert stored_after and len(stored_after[0].block_hashes) == 6
        s.shutdown()
        w.shutdown()
    finally:
        stop_daemon(proc)


class NS_events:
    """vLLM's KVEventsConfig, as the connector reads it."""

    def __init__(self, on):
        self.enable_kv_cache_events = on


def test_store_events_api_bounds():
    with tempfile.TemporaryDirectory() as d:
        st = _lib.Store({"store.arena_size": "1m",
                         "store.arena_chunk": "1m"})
        try:
            with pytest.raises(_lib.KvdepotError):
                st.events_enable((1 << 20) + 1)
            assert st.events_enable(2)
            ns = _lib.namespace("m", 1, 0, 0, 1, 1, 64, 16)
            st.delete(ns, [bytes([i]) * 32 for i in range(3)])
            assert st.take_events() == ([], 0)  # absent keys: nothing
            assert st.events_enable(0)
        finally:
            st.close()
        assert d
