"""Block identity against vLLM's sha256_cbor recipe, reproduced in Python.

vLLM (v1/core/kv_cache_utils.py) hashes each full block as
    sha256(cbor2.dumps((parent, tuple(token_ids), extra_keys), canonical=True))
with the root NONE_HASH = sha256_cbor(PYTHONHASHSEED) and extra_keys either
None or the tuple  lora_name, (mm_identifier, mm_offset - block_start)...,
cache_salt (block 0 only, when truthy), sha256(prompt-embeds slice).
This module rebuilds that recipe with cbor2 + hashlib and compares it, link
by link, with libkvdepot (loaded with ctypes from $KVDEPOT_LIB) on random
token lists, block sizes and extras. The random seed is printed and can be
pinned with KVD_TEST_SEED=<n>.
"""

import ctypes
import hashlib
import os
import random
import subprocess
import sys

import cbor2
import pytest

LIB_PATH = os.environ.get("KVDEPOT_LIB")
SEED = int(os.environ.get("KVD_TEST_SEED") or random.SystemRandom().randrange(2**32))
print(f"test_block_hash_vectors: KVD_TEST_SEED={SEED}")

KVD_OK = 0
KVD_ERR_INVALID = -1
KVD_ERR_RANGE = -4
HASH_BYTES = 32


def _asan_runtime(path):
    """The ASan runtime a sanitized build links, if this process lacks it.

    A library built with -fsanitize=address aborts the interpreter when it is
    dlopen()ed unless the runtime was preloaded, so such a build is tested in
    a child interpreter started with LD_PRELOAD instead.
    """
    if path is None or "libasan" in os.environ.get("LD_PRELOAD", ""):
        return None
    try:
        out = subprocess.run(["ldd", path], capture_output=True, text=True,
                             check=False).stdout
    except OSError:
        return None
    for line in out.splitlines():
        if "libasan" in line and "=>" in line:
            return line.split("=>")[1].split("(")[0].strip()
    return None


ASAN_RUNTIME = _asan_runtime(LIB_PATH)
needs_lib = pytest.mark.skipif(LIB_PATH is None or ASAN_RUNTIME is not None,
                               reason="KVDEPOT_LIB unset, or sanitized build "
                               "(run by test_sanitized_build_in_child)")


class MmExtra(ctypes.Structure):
    _fields_ = [("identifier", ctypes.c_char_p), ("offset", ctypes.c_int64)]


class BlockExtras(ctypes.Structure):
    _fields_ = [
        ("lora_name", ctypes.c_char_p),
        ("mm", ctypes.POINTER(MmExtra)),
        ("num_mm", ctypes.c_size_t),
        ("cache_salt", ctypes.c_char_p),
        ("prompt_embeds", ctypes.POINTER(ctypes.c_uint8)),
    ]


Hash = ctypes.c_uint8 * HASH_BYTES


@pytest.fixture(scope="module")
def lib():
    so = ctypes.CDLL(LIB_PATH)
    so.kvd_block_hash_seed.argtypes = [ctypes.c_char_p, ctypes.POINTER(Hash)]
    so.kvd_block_hash_seed.restype = ctypes.c_int
    so.kvd_block_hash.argtypes = [
        ctypes.POINTER(Hash), ctypes.POINTER(ctypes.c_uint32), ctypes.c_size_t,
        ctypes.POINTER(BlockExtras), ctypes.POINTER(Hash)]
    so.kvd_block_hash.restype = ctypes.c_int
    so.kvd_block_hash_chain.argtypes = [
        ctypes.POINTER(Hash), ctypes.POINTER(ctypes.c_uint32), ctypes.c_size_t,
        ctypes.c_size_t, ctypes.POINTER(BlockExtras),
        ctypes.POINTER(BlockExtras), ctypes.POINTER(Hash), ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_size_t)]
    so.kvd_block_hash_chain.restype = ctypes.c_int
    return so


# --- vLLM's recipe, rebuilt -------------------------------------------------

def sha256_cbor(obj):
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def vllm_extra_keys(lora=None, mm=(), salt=None, embeds=None):
    """generate_block_hash_extra_keys: LoRA, mm pairs, salt, embeds hash."""
    keys = []
    if lora is not None:
        keys.append(lora)
    keys.extend((ident, off) for ident, off in mm)
    if salt:
        keys.append(salt)
    if embeds is not None:
        keys.append(embeds)
    return tuple(keys) if keys else None


def vllm_hash_block(parent, tokens, extra_keys):
    return sha256_cbor((parent, tuple(tokens), extra_keys))


def mm_keys_for_block(features, start, end):
    """(identifier, offset - start) for every mm input overlapping the
    block [start, end), the way _gen_mm_extra_hash_keys walks them."""
    return [(ident, off - start) for ident, off, length in features
            if off < end and off + length > start]


# --- ctypes side -------------------------------------------------------------

def c_tokens(tokens):
    return (ctypes.c_uint32 * max(len(tokens), 1))(*tokens)


def c_extras(lora=None, mm=(), salt=None, embeds=None):
    ex = BlockExtras()
    ex.lora_name = None if lora is None else lora.encode()
    if mm:
        arr = (MmExtra * len(mm))(*[MmExtra(i.encode(), o) for i, o in mm])
        ex.mm = arr
        ex.num_mm = len(mm)
    ex.cache_salt = None if salt is None else salt.encode()
    if embeds is not None:
        ex.prompt_embeds = (ctypes.c_uint8 * HASH_BYTES)(*embeds)
    return ctypes.pointer(ex)


def c_seed(lib, seed):
    out = Hash()
    assert lib.kvd_block_hash_seed(seed.encode(), ctypes.byref(out)) == KVD_OK
    return bytes(out)


def c_block(lib, parent, tokens, extras):
    p = Hash(*parent)
    out = Hash()
    rc = lib.kvd_block_hash(ctypes.byref(p), c_tokens(tokens), len(tokens),
                            extras, ctypes.byref(out))
    assert rc == KVD_OK
    return bytes(out)


# --- random inputs -----------------------------------------------------------

BOUNDARY_TOKENS = [0, 1, 23, 24, 255, 256, 65535, 65536, 2**31, 2**32 - 1]
ALPHABET = "abcxyz-_/:. 0123456789üé水🦀"


def rand_tokens(rng, n):
    kind = rng.randrange(3)
    if kind == 0:
        return [rng.randrange(50000) for _ in range(n)]
    if kind == 1:
        return [rng.choice(BOUNDARY_TOKENS) for _ in range(n)]
    return [rng.randrange(2**32) for _ in range(n)]


def rand_text(rng, max_len=40):
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(max_len)))


def rand_extras(rng):
    """Keyword arguments for one block's extras; any subset may be absent."""
    kw = {}
    if rng.random() < 0.5:
        kw["lora"] = rand_text(rng)
    if rng.random() < 0.4:
        kw["mm"] = [("mm-" + rand_text(rng, 70),
                     rng.choice([0, 5, -1, -24, -25, 23, 24, 300, -70000,
                                 rng.randrange(-2**40, 2**40)]))
                    for _ in range(rng.randrange(1, 4))]
    if rng.random() < 0.5:
        kw["salt"] = rand_text(rng)
    if rng.random() < 0.4:
        kw["embeds"] = hashlib.sha256(rng.randbytes(64)).digest()
    return kw


# --- tests -------------------------------------------------------------------

@needs_lib
def test_seed_is_sha256_of_cbor_text(lib):
    rng = random.Random(SEED)
    seeds = ["0", "42", "4294967295", "kvdepot", "", "ü水🦀"]
    seeds += [str(rng.randrange(2**32)) for _ in range(50)]
    seeds += [rand_text(rng, 400) for _ in range(50)]
    for s in seeds:
        assert c_seed(lib, s) == sha256_cbor(s), (SEED, s)


@needs_lib
def test_single_blocks_with_every_kind_of_extra(lib):
    rng = random.Random(SEED ^ 0x1)
    root = sha256_cbor("0")
    for i in range(400):
        n = rng.choice([0, 1, 16, 16, 64, 256])
        tokens = rand_tokens(rng, n)
        parent = root if i % 4 == 0 else rng.randbytes(HASH_BYTES)
        kw = rand_extras(rng)
        expect = vllm_hash_block(parent, tokens, vllm_extra_keys(**kw))
        got = c_block(lib, parent, tokens, c_extras(**kw))
        assert got == expect, (SEED, i, n, kw)


@needs_lib
def test_null_extras_equal_absent_extras(lib):
    rng = random.Random(SEED ^ 0x2)
    root = sha256_cbor("0")
    for _ in range(20):
        tokens = rand_tokens(rng, 16)
        expect = vllm_hash_block(root, tokens, None)
        assert c_block(lib, root, tokens, None) == expect
        assert c_block(lib, root, tokens, c_extras()) == expect
        assert c_block(lib, root, tokens, c_extras(salt="")) == expect


@needs_lib
def test_request_with_multimodal_inputs_block_by_block(lib):
    """A whole request hashed the way vLLM's request_block_hasher does:
    per-block mm keys with offsets relative to the block start, the salt on
    block 0, a LoRA name and a prompt-embeds hash on every block."""
    rng = random.Random(SEED ^ 0x3)
    for r in range(40):
        block_size = rng.choice([1, 16, 64])
        n = block_size * rng.randrange(1, 12) + rng.randrange(block_size)
        tokens = rand_tokens(rng, n)
        features, pos = [], rng.randrange(8)
        while pos < n:
            length = rng.randrange(1, 3 * block_size + 2)
            features.append(("img-" + rand_text(rng, 30), pos, length))
            pos += length + rng.randrange(2 * block_size)
        lora = rand_text(rng) if rng.random() < 0.5 else None
        salt = rand_text(rng) if rng.random() < 0.7 else None
        use_embeds = rng.random() < 0.3
        parent = sha256_cbor(str(rng.randrange(2**32)))
        c_parent = parent
        for b in range(n // block_size):
            start, end = b * block_size, (b + 1) * block_size
            kw = {"lora": lora, "mm": mm_keys_for_block(features, start, end),
                  "salt": salt if start == 0 else None}
            if use_embeds:
                kw["embeds"] = hashlib.sha256(
                    bytes(str(tokens[start:end]), "ascii")).digest()
            parent = vllm_hash_block(parent, tokens[start:end],
                                     vllm_extra_keys(**kw))
            c_parent = c_block(lib, c_parent, tokens[start:end],
                               c_extras(**kw))
            assert c_parent == parent, (SEED, r, b, kw)


@needs_lib
def test_chains_link_by_link(lib):
    rng = random.Random(SEED ^ 0x4)
    for c in range(120):
        block_size = rng.choice([1, 16, 64, 256])
        n = block_size * rng.randrange(0, 9) + rng.randrange(block_size)
        if block_size == 1:
            n = rng.randrange(0, 300)
        tokens = rand_tokens(rng, n)
        root = sha256_cbor(rng.choice(["0", "kvdepot", rand_text(rng)]))
        first_kw = rand_extras(rng) if rng.random() < 0.7 else None
        later_kw = rand_extras(rng) if rng.random() < 0.7 else None

        expect, parent = [], root
        for b in range(n // block_size):
            kw = first_kw if b == 0 else later_kw
            keys = vllm_extra_keys(**kw) if kw is not None else None
            parent = vllm_hash_block(
                parent, tokens[b * block_size:(b + 1) * block_size], keys)
            expect.append(parent)

        slots = len(expect) + rng.randrange(3)
        out = (Hash * max(slots, 1))()
        count = ctypes.c_size_t(12345)
        rc = lib.kvd_block_hash_chain(
            ctypes.byref(Hash(*root)), c_tokens(tokens), n, block_size,
            None if first_kw is None else c_extras(**first_kw),
            None if later_kw is None else c_extras(**later_kw),
            out, slots, ctypes.byref(count))
        assert rc == KVD_OK, (SEED, c)
        assert count.value == len(expect), (SEED, c)
        for b, link in enumerate(expect):
            assert bytes(out[b]) == link, (SEED, c, b, block_size)


@needs_lib
def test_chain_too_small_and_bad_arguments(lib):
    root = Hash(*sha256_cbor("0"))
    tokens = c_tokens(list(range(64)))
    out = (Hash * 4)()
    sentinel = bytes(out[0])
    count = ctypes.c_size_t(99)
    assert lib.kvd_block_hash_chain(ctypes.byref(root), tokens, 64, 16, None,
                                    None, out, 3,
                                    ctypes.byref(count)) == KVD_ERR_RANGE
    assert count.value == 99 and bytes(out[0]) == sentinel
    assert lib.kvd_block_hash_chain(ctypes.byref(root), tokens, 64, 0, None,
                                    None, out, 4,
                                    ctypes.byref(count)) == KVD_ERR_INVALID
    assert lib.kvd_block_hash(None, tokens, 16, None,
                              ctypes.byref(Hash())) == KVD_ERR_INVALID


@pytest.mark.skipif(ASAN_RUNTIME is None, reason="not a sanitized build")
def test_sanitized_build_in_child():
    env = dict(os.environ, LD_PRELOAD=ASAN_RUNTIME, KVD_TEST_SEED=str(SEED),
               ASAN_OPTIONS="detect_leaks=0")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         __file__], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
