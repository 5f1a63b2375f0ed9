"""Chapter 5: the associative-recall task, the whole transformer and its training loop."""

import copy

import numpy as np
import pytest

from attn_np.convert import mha_to_gqa
from attn_np.instruments.blas import (
    blas_threads,
    get_blas_threads,
    set_blas_threads,
)
from attn_np.instruments.gradcheck import TOLERANCE, check_layer_gradients
from attn_np.multihead import GroupedQueryAttention
from attn_np.training.loop import evaluate, lr_at, train, train_many
from attn_np.training.tasks import AssociativeRecall
from attn_np.training.transformer import Block, Transformer

VARIANTS = {"MHA": 4, "GQA": 2, "MQA": 1}  # n_kv_heads for n_heads = 4


def tiny_model(n_kv_heads, dtype=np.float64, seed=0, vocab=7):
    return Transformer(
        vocab_size=vocab,
        d_model=8,
        n_layers=2,
        n_heads=4,
        n_kv_heads=n_kv_heads,
        d_ff=12,
        max_len=6,
        seed=seed,
        dtype=dtype,
    )


def randomise_gains(model, seed):
    """RMSNorm gains start at ones; random gains make the gradient check see their effect everywhere."""
    rng = np.random.default_rng(seed)
    for name, p in model.params.items():
        if name.endswith(".g"):
            p[:] = 1 + 0.3 * rng.standard_normal(p.shape)


# ------------------------------------------------------------------------------------ the task
def test_recall_sequences_are_well_formed():
    task = AssociativeRecall(n_pairs=5, n_queries=3, n_keys=9, n_values=4)
    b = task.sample(200, seed=0)
    P = task.n_pairs
    assert (
        b.inputs.shape
        == b.targets.shape
        == b.mask.shape
        == (200, task.seq_len)
        == (200, 13)
    )
    keys, values, queries = (
        b.inputs[:, 0 : 2 * P : 2],
        b.inputs[:, 1 : 2 * P : 2],
        b.inputs[:, 2 * P :],
    )
    assert (
        keys.max() < 9
        and values.min() >= 9
        and values.max() < task.vocab_size == 13
    )
    for row in range(200):
        assert len(set(keys[row])) == P  # keys in a sequence are distinct
        assert len(set(queries[row])) == 3  # so are the queried keys
        lookup = dict(zip(keys[row], values[row]))
        assert [lookup[q] for q in queries[row]] == list(
            b.targets[row, 2 * P :]
        )
    assert not b.mask[:, : 2 * P].any() and b.mask[:, 2 * P :].all()


def test_recall_is_deterministic_in_its_seed():
    task = AssociativeRecall()
    a, b, c = (
        task.sample(4, seed=(1, 2)),
        task.sample(4, seed=(1, 2)),
        task.sample(4, seed=(1, 3)),
    )
    assert np.array_equal(a.inputs, b.inputs) and np.array_equal(
        a.targets, b.targets
    )
    assert not np.array_equal(a.inputs, c.inputs)
    assert task.labels([0, 15, 16, 31]) == ["k0", "k15", "v0", "v15"]


def test_recall_rejects_impossible_sizes():
    with pytest.raises(ValueError, match="n_pairs must be <= n_keys"):
        AssociativeRecall(n_pairs=9, n_keys=8)
    with pytest.raises(ValueError, match="n_queries must be <= n_pairs"):
        AssociativeRecall(n_pairs=3, n_queries=4)
    with pytest.raises(
        ValueError, match="n_values must be a positive integer"
    ):
        AssociativeRecall(n_values=0)


# --------------------------------------------------------------------------- gradient checks
def test_block_gradients_every_input_and_parameter():
    block = Block(GroupedQueryAttention(8, 4, 2, seed=1), d_ff=12, seed=2)
    randomise_gains(block, 3)
    x = np.random.default_rng(4).standard_normal((2, 5, 8))
    errors = check_layer_gradients(block, x, seed=5)
    assert set(errors) == {"x"} | set(block.params)
    assert max(errors.values()) < TOLERANCE, errors


@pytest.mark.parametrize("family", VARIANTS)
def test_whole_model_gradients_every_parameter(family):
    model = tiny_model(VARIANTS[family], seed=6)
    randomise_gains(model, 7)
    ids = np.array(
        [[0, 3, 6, 3, 1], [5, 5, 2, 0, 4]]
    )  # repeated tokens, every embedding row but none
    errors = check_layer_gradients(model, ids, seed=8)
    assert set(errors) == set(
        model.params
    )  # token ids have no gradient; every parameter is checked
    assert (
        len(errors) == 1 + 2 * 10 + 3
    )  # embed, 2 x (norm1.g, W_q/k/v/o, norm2.g, W1/b1/W2/b2), norm_f.g, head W/b
    bad = {k: v for k, v in errors.items() if not v < TOLERANCE}
    assert not bad, bad


# ------------------------------------------------------------------------- model bookkeeping
def test_params_are_keyed_by_layer_and_shared_with_the_layers():
    model = tiny_model(2)
    params = model.params
    assert params["block1.attn.W_k"] is model.blocks[1].attn.params["W_k"]
    assert params["block0.attn.W_k"].shape == (
        8,
        2 * 2,
    )  # [d_model, n_kv_heads * d_k]
    assert params["block0.ffn.up.W"].shape == (8, 12)
    assert list(params)[0] == "embed.W" and list(params)[-1] == "head.b"
    assert set(model.grads) == set(params)


def test_kv_bytes_per_token():
    for n_kv in (4, 2, 1):
        model = tiny_model(n_kv, dtype=np.float32)
        assert (
            model.kv_bytes_per_token() == 2 * 2 * n_kv * 2 * 4
        )  # layers * (K and V) * n_kv * d_k * 4 bytes
    assert tiny_model(1).kv_bytes_per_token() == 2 * 2 * 1 * 2 * 8


def test_same_seed_same_non_attention_weights():
    a, b = tiny_model(4, seed=3), tiny_model(1, seed=3)
    for name in (
        "embed.W",
        "block0.ffn.up.W",
        "block1.ffn.down.W",
        "head.W",
    ):
        assert np.array_equal(a.params[name], b.params[name])


def test_model_rejects_bad_token_ids():
    model = tiny_model(2)
    with pytest.raises(
        ValueError,
        match=r"ids must lie in \[0, vocab_size\) = \[0, 7\), got values from 0 to 7",
    ):
        model.forward(np.array([[0, 7]]))
    with pytest.raises(ValueError, match=r"ids must lie in"):
        model.forward(np.array([[-1, 2]]))
    with pytest.raises(ValueError, match=r"max_len=6, got \(1, 7\)"):
        model.forward(np.zeros((1, 7), dtype=int))
    with pytest.raises(ValueError, match=r"shape \[B, L\]"):
        model.forward(np.zeros(3, dtype=int))
    with pytest.raises(TypeError, match="integer array of token ids"):
        model.forward(np.zeros((1, 3)))


def test_causal_no_position_sees_the_future():
    model = tiny_model(2)
    ids = np.array([[1, 2, 3, 4, 5]])
    logits = model.forward(ids)
    changed = ids.copy()
    changed[0, 3:] = 0
    np.testing.assert_allclose(
        model.forward(changed)[0, :3], logits[0, :3], rtol=1e-12, atol=1e-12
    )


# ---------------------------------------------------------------------------------- training
def test_lr_schedule_warms_up_and_decays():
    lrs = [lr_at(s, 100, 1.0, 10) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:])) and lrs[-1] < 0.01


@pytest.mark.parametrize("family", VARIANTS)
def test_short_training_lowers_the_loss(family):
    task = AssociativeRecall(n_pairs=3, n_queries=3, n_keys=4, n_values=3)
    model = Transformer(
        vocab_size=task.vocab_size,
        d_model=16,
        n_layers=2,
        n_heads=4,
        n_kv_heads=VARIANTS[family],
        d_ff=32,
        max_len=task.seq_len,
        seed=0,
        dtype=np.float32,
    )
    with blas_threads(
        1
    ):  # tiny matrices: one BLAS thread is much faster (attn_np.instruments.blas)
        log = train(model, task, steps=150, batch_size=32, lr=1e-2, seed=0)
    first, last = np.mean(log.losses[:10]), np.mean(log.losses[-10:])
    assert first > 1.0  # about log(3): guessing among the values
    assert last < 0.75 * first, (first, last)


def _tiny_run(n_kv, seed, steps):
    task = AssociativeRecall(n_pairs=3, n_queries=3, n_keys=4, n_values=3)
    model = Transformer(
        vocab_size=task.vocab_size,
        d_model=8,
        n_layers=1,
        n_heads=4,
        n_kv_heads=n_kv,
        d_ff=16,
        max_len=task.seq_len,
        seed=seed,
        dtype=np.float32,
    )
    kwargs = dict(
        steps=steps, batch_size=8, lr=1e-2, seed=seed, log_at=(steps,)
    )
    return model, task, kwargs


@pytest.mark.parametrize("workers", [1, 2])
def test_train_many_is_train_run_by_run_bit_for_bit(workers, capsys):
    runs = [_tiny_run(4, 0, 12), _tiny_run(1, 1, 20), _tiny_run(2, 2, 6)]
    alone = [_tiny_run(4, 0, 12), _tiny_run(1, 1, 20), _tiny_run(2, 2, 6)]
    with blas_threads(1):
        got = train_many(runs, workers=workers)
        logs = [train(m, t, **k) for m, t, k in alone]
    capsys.readouterr()  # what train printed for the runs alone
    assert len(got) == 3
    for (model, log, printed), (ref, _, k), ref_log in zip(got, alone, logs):
        assert log.losses == ref_log.losses
        assert model.params.keys() == ref.params.keys()
        for key, p in ref.params.items():
            np.testing.assert_array_equal(model.params[key], p)
        assert (
            printed == f"step {k['steps']:4d}  loss {log.losses[-1]:.3f}\n"
        )


def test_train_many_refuses_bad_runs():
    with pytest.raises(TypeError, match="runs must be a list"):
        train_many([_tiny_run(1, 0, 2)[:2]])
    with pytest.raises(ValueError, match="workers"):
        train_many([_tiny_run(1, 0, 2)], workers=0)


def test_mean_pool_conversion_then_training_runs_on_the_model():
    task = AssociativeRecall(n_pairs=3, n_queries=3, n_keys=4, n_values=3)
    model = Transformer(
        vocab_size=task.vocab_size,
        d_model=16,
        n_layers=2,
        n_heads=4,
        n_kv_heads=4,
        d_ff=32,
        max_len=task.seq_len,
        seed=0,
        dtype=np.float32,
    )
    converted = copy.deepcopy(model)
    for blk in converted.blocks:
        blk.attn = mha_to_gqa(blk.attn, 2)
    assert converted.params["block0.attn.W_k"].shape == (16, 2 * 4)
    assert converted.kv_bytes_per_token() == model.kv_bytes_per_token() // 2
    batch = task.sample(64, seed=1)
    before = evaluate(converted, batch)
    train(converted, task, steps=5, batch_size=8, lr=1e-3, seed=2)
    assert (
        0.0 <= before <= 1.0
        and converted.params["block0.attn.W_k"].dtype == np.float32
    )


def test_blas_threads_sets_and_restores():
    before = get_blas_threads()
    with blas_threads(1):
        assert get_blas_threads() in (1, None)
    assert get_blas_threads() == before
    with pytest.raises(ValueError, match="positive integer"):
        set_blas_threads(0)
