"""What the kvdepot.trtllm tests stand in for, because TensorRT-LLM cannot
be imported here (docs/trtllm.md, "What ran against TensorRT-LLM").

Named stand-ins, each for one piece of TensorRT-LLM 1.2:
- Manager: KvCacheConnectorManager's bookkeeping of asynchronous loads and
  saves (tensorrt_llm/_torch/pyexecutor/kv_cache_connector.py): the ids it
  passes to get_finished (each once), the KeyError of extract_by_id for an
  id it never passed, and the all-ranks intersection over mpi_allgather.
- PipeComm: mpi_broadcast / mpi_allgather between two rank processes.
- LlmRequest: the request attributes the connector reads.
"""

import pickle
from types import SimpleNamespace as NS


class LlmRequest:
    """Attributes of TensorRT-LLM's C++ LlmRequest the connector reads:
    request_id, get_tokens(beam), cache_salt_id, multimodal_hashes (eight
    int32 per item), multimodal_positions, multimodal_lengths."""

    def __init__(self, rid, tokens, cache_salt=None, **attrs):
        self.request_id = rid
        self._tokens = list(tokens)
        self.cache_salt = cache_salt
        self.__dict__.update(attrs)

    def get_tokens(self, beam):
        return self._tokens


def rd(rid, blocks, tokens, pos, n):
    """RequestData (classic fields)."""
    return NS(request_id=rid, new_block_ids=blocks, new_tokens=tokens,
              computed_position=pos, num_scheduled_tokens=n)


def sched_out(new=(), cached=()):
    return NS(new_requests=list(new), cached_requests=list(cached))


class SoloComm:
    rank = 0

    def allgather(self, obj):
        return [obj]

    def bcast(self, obj):
        return pickle.loads(pickle.dumps(obj))  # as MPI would


class PipeComm:
    """Two ranks joined by a multiprocessing Pipe (conn None: one rank)."""

    def __init__(self, rank, conn):
        self.rank, self.conn = rank, conn

    def allgather(self, obj):
        if self.conn is None:
            return [obj]
        self.conn.send(obj)
        other = self.conn.recv()
        return [obj, other] if self.rank == 0 else [other, obj]

    def bcast(self, obj):
        if self.conn is None:
            return obj
        if self.rank == 0:
            self.conn.send(obj)
            return obj
        return self.conn.recv()


class Manager:
    """KvCacheConnectorManager's async bookkeeping, per rank."""

    def __init__(self, worker, scheduler, comm):
        self.worker, self.scheduler, self.comm = worker, scheduler, comm
        self.new_saving, self.new_loading = set(), set()
        self.pending_saving, self.pending_loading = set(), set()
        self.local_saving, self.local_loading = set(), set()
        self.loaded, self.saved = set(), set()

    def _leader(self, f):
        return self.comm.bcast(f() if self.scheduler is not None else None)

    def get_num_new_matched_tokens(self, request, num_computed):
        n, is_async = self._leader(
            lambda: self.scheduler.get_num_new_matched_tokens(
                request, num_computed))
        if n == 0 and is_async:
            raise RuntimeError("load_kv_async must be False when "
                               "num_tokens is 0!")
        if is_async:
            self.new_loading.add(request.request_id)
        return n, is_async

    def update_state_after_alloc(self, request, blocks):
        if self.scheduler is not None:
            self.scheduler.update_state_after_alloc(request, blocks)

    def request_finished(self, request, blocks):
        keep = self._leader(lambda: self.scheduler.request_finished(
            request, blocks))
        if keep:
            self.new_saving.add(request.request_id)
        return keep

    def step(self, out, layers, raise_in_forward=None):
        """handle_metadata, the forward pass's hooks, wait_for_save,
        get_finished. Returns the exception the forward pass raised (the
        executor's _forward_step answers the step's requests with it and
        skips wait_for_save), or None."""
        meta = self._leader(lambda: self.scheduler.build_connector_meta(out))
        self.worker.bind_connector_meta(meta)
        self.worker.start_load_kv(None)
        err = None
        try:
            for layer in range(layers):
                self.worker.wait_for_layer_load(layer, None)
                if raise_in_forward is not None and layer == raise_in_forward:
                    raise RuntimeError("forward pass failed")
                self.worker.save_kv_layer(layer, None)
            self.worker.wait_for_save(None)
        except Exception as e:  # noqa: BLE001 - what _forward_step catches
            err = e
        self.get_finished()
        return err

    def get_finished(self):
        started, finished = sorted(self.new_loading), sorted(self.new_saving)
        self.pending_loading |= self.new_loading
        self.pending_saving |= self.new_saving
        self.new_loading, self.new_saving = set(), set()
        saving, loading = self.worker.get_finished(finished, started)
        for i in saving:
            self.pending_saving.remove(i)  # KeyError as extract_by_id
        for i in loading:
            self.pending_loading.remove(i)
        self.local_saving |= set(saving)
        self.local_loading |= set(loading)
        res = self.comm.allgather((sorted(self.local_saving),
                                   sorted(self.local_loading)))
        all_saving = set.intersection(*(set(r[0]) for r in res))
        all_loading = set.intersection(*(set(r[1]) for r in res))
        self.local_saving -= all_saving
        self.local_loading -= all_loading
        self.saved |= all_saving
        self.loaded |= all_loading
        return all_saving, all_loading
