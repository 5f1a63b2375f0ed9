"""The KV calculator's command line: context lengths in k and M, caches of
a fractional number of bytes per number (4 bits), a note past the config's
max_position_embeddings, and --json."""

import json
from fractions import Fraction

import pytest

from attn_np import costs
from attn_np.costs.model import element_bytes
from attn_np.memory import main, parse_length

CONFIG = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size": 64,
    "max_position_embeddings": 4096,
}


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG))
    return str(path)


@pytest.mark.parametrize(
    "text, tokens",
    [("131072", 131072), ("128k", 131072), ("128K", 131072), ("1M", 2**20)],
)
def test_lengths_in_k_and_m_are_powers_of_two(text, tokens):
    assert parse_length(text) == tokens


@pytest.mark.parametrize("text", ["12x", "1.5k", "-3", "k", "", "1e5"])
def test_a_length_that_is_not_one_is_refused_by_name(text):
    with pytest.raises(ValueError, match="--seq-len"):
        parse_length(text)


def test_a_four_bit_cache_is_half_the_eight_bit_one():
    cfg = costs.get_model("llama-3-8b")
    eight = costs.kv_cache_bytes(cfg, 4096, bytes_per_element=1)
    four = costs.kv_cache_bytes(cfg, 4096, bytes_per_element=0.5)
    assert four * 2 == eight
    assert costs.kv_bytes_per_token(cfg, 0.5) * 4 == (
        costs.kv_bytes_per_token(cfg, 2)
    )


@pytest.mark.parametrize("bad", [0.3, 0, -1, float("nan"), "2", True, 1e9])
def test_bytes_per_element_must_be_whole_bits(bad):
    with pytest.raises(ValueError, match="bytes_per_element"):
        element_bytes(bad)


def test_element_bytes_are_exact():
    assert element_bytes(0.375) == Fraction(3, 8)
    assert element_bytes(2) == 2


def test_the_command_takes_128k_and_half_a_byte(config, capsys):
    assert (
        main([config, "--seq-len", "2k", "--bytes-per-element", "0.5"]) == 0
    )
    out = capsys.readouterr().out
    # 2 layers x 2 heads x (16 + 16) numbers x 2048 tokens x 0.5 bytes
    assert f"{2 * 2 * 32 * 2048 // 2:,} bytes" in out
    assert "4 bits per number" in out
    assert "2,048 tokens" in out and "note" not in out


def test_the_command_notes_a_context_past_max_position_embeddings(
    config, capsys
):
    assert main([config, "--seq-len", "8k"]) == 0
    out = capsys.readouterr().out
    assert "past the config's" in out
    assert "max_position_embeddings (4,096)" in out
    assert max(len(line) for line in out.splitlines()) <= 77


def test_json_prints_the_numbers(config, capsys):
    argv = [config, "--seq-len", "8k", "--budget", "1MiB", "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["seq_len"] == 8192
    assert data["bytes_per_token"] == 2 * 2 * 32 * 2
    assert data["kv_cache_bytes"] == 8192 * data["bytes_per_token"]
    assert data["max_position_embeddings"] == 4096
    assert data["beyond_max_position_embeddings"] is True
    assert data["max_context"] == 2**20 // data["bytes_per_token"]


@pytest.mark.parametrize(
    "argv, word",
    [
        (["--seq-len", "12x"], "--seq-len"),
        (["--seq-len", "8", "--bytes-per-element", "0.3"], "bits"),
    ],
)
def test_bad_arguments_are_one_line(config, capsys, argv, word):
    assert main([config, *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and word in err
    assert len(err.strip().splitlines()) == 1
