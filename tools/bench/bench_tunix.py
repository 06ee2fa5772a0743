"""Tunix's sampler (issue 16 (d)) on issue 16's workload (a), with our weights.

Tunix (https://github.com/google/tunix, PyPI ``google-tunix``) is the JAX peer: its
``tunix.generate.sampler.Sampler`` runs a static batch (prefill, then a ``lax.while_loop`` of
one-token steps over a dense KV cache). This script builds Tunix's Llama-3 model
(``tunix.models.llama3.model.Llama3``) with the shapes of our model, copies OUR weights into
it (no download: the same params ``common.load_model`` gives the other benchmarks), checks
that Tunix's greedy tokens equal our engine's on a short run, then times the Sampler on
workload (a) exactly as ``bench_engine.py`` times our engines: B prompts × G samples (the
Sampler has no samples-per-prompt argument, so each prompt is repeated G times: B·G rows,
as bench_engine.py does for transformers), fixed prompt length P, M new tokens per row,
float32, greedy and sampling (τ = 1, top-p 0.95), an untimed warm-up (compile) call, then the
best of ``--repeats`` timed calls; tokens/s counts useful tokens = B·G·M.

How the Sampler is driven (it takes strings, not token ids): a minimal tokenizer object
(encode = the space-separated ids, decode = "", no BOS) so the random prompts go in as ids and
no detokenisation is timed; its pad id is -1 and its EOS id -2, ids the model never emits, so
no row stops early and padding never masks a generated token: every row runs the full M steps
(forced lengths, as ``use_model_eos=False`` does for our engines). ``max_prompt_length`` = P
(no padding: P is a power of two in (a)) and the KV cache holds P + M positions.

Tunix 0.1.7's Llama-3 attention calls ``apply_rope`` without the config's ``rope_theta`` (the
function's default, 1e6, is used for every model); SmolLM2's base is 1e5, so by default the
script binds ``rope_theta`` to the model's value (``functools.partial`` over Tunix's own
function; same cost). ``--tunix-rope-as-is`` leaves Tunix unchanged (its tokens then differ).

With ``--with-ours`` our static and paged engines (float32, the same settings as
bench_engine.py) run on the same prompts in the same process, and the report adds ours / Tunix
and the fraction of greedy tokens on which Tunix and our static engine agree.

Tunix is not a dependency of jaxrl_llm; it runs in its own environment (``.venv-tunix``, made
by ``tools/bench/setup_tunix.sh``), with this checkout on PYTHONPATH:

    bash tools/bench/setup_tunix.sh
    PYTHONPATH=. .venv-tunix/bin/python tools/bench/bench_tunix.py --with-ours \\
        --out tools/bench/results/tunix.md
Smoke test:
    PYTHONPATH=. .venv-tunix/bin/python tools/bench/bench_tunix.py --smoke --with-ours \\
        --out /tmp/tunix.md
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

PAD_ID = -1  # never a model output: padding can't mask a generated token
EOS_ID = -2  # never a model output: no row stops before M tokens


def _parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=common.DEFAULT_MODEL, help="alias/path or 'tiny'")
    p.add_argument("--smoke", action="store_true", help="tiny model, tiny workload")
    p.add_argument("--prompts", type=int, default=4, help="B")
    p.add_argument("--group", type=int, default=8, help="G samples per prompt")
    p.add_argument("--prompt-len", type=int, default=64, help="P")
    p.add_argument("--new-tokens", type=int, default=128, help="M")
    p.add_argument("--modes", default="greedy,sampling", help="greedy, sampling or both")
    p.add_argument("--repeats", type=int, default=2, help="timed repetitions (best is kept)")
    p.add_argument("--check-rows", type=int, default=2, help="rows of the greedy token check")
    p.add_argument("--check-new-tokens", type=int, default=8, help="tokens of the check")
    p.add_argument(
        "--check-only", action="store_true", help="only the greedy token check, no timing"
    )
    p.add_argument(
        "--with-ours", action="store_true", help="also time our static and paged engines"
    )
    p.add_argument("--num-slots", type=int, default=64, help="paged engine decode slots")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--chunk-steps", type=int, default=16)
    p.add_argument(
        "--tunix-rope-as-is",
        action="store_true",
        help="keep Tunix 0.1.7's RoPE base (1e6 for every model) instead of the model's",
    )
    p.add_argument("--out", default=None, help="write the markdown report here")
    args = p.parse_args(argv)
    if args.smoke:
        args.model = common.TINY
        args.prompts, args.group, args.prompt_len, args.new_tokens = 2, 2, 8, 8
        args.check_rows, args.check_new_tokens = 2, 8
        args.num_slots, args.page_size, args.chunk_steps, args.repeats = 4, 4, 4, 1
    return args


class IdTokenizer:
    """The tokenizer interface Tunix's ``TokenizerAdapter`` accepts (encode, decode, bos_id,
    eos_id, pad_id), over prompts written as space-separated token ids."""

    def encode(self, text: str, **_) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, ids, **_) -> str:
        return ""  # the benchmark reads token ids; detokenisation is not timed

    def bos_id(self):
        return None  # no BOS prepended

    def eos_id(self) -> int:
        return EOS_ID

    def pad_id(self) -> int:
        return PAD_ID


def _check_supported(config) -> None:
    from jaxrl_llm.models.config import Family, RopeScaling

    bad = [
        name
        for name, ok in [
            ("family llama", config.family == Family.LLAMA),
            ("no attention bias", not config.attention_bias),
            ("no qk norm", not config.qk_norm),
            ("no RoPE scaling", config.rope_scaling == RopeScaling.NONE),
            ("no sliding window", config.sliding_window is None),
            ("dense MLP", config.num_experts == 0),
            ("plain RMSNorm scale", not config.rms_norm_unit_offset),
            ("unscaled embeddings", not config.scale_embeddings),
            ("1/sqrt(head_dim) attention", config.query_pre_attn_scalar is None),
            (
                "no logit soft-caps",
                not config.attn_logit_softcap and not config.final_logit_softcap,
            ),
        ]
        if not ok
    ]
    if bad:
        raise SystemExit(f"Tunix's Llama3 model cannot express this config: needs {bad}")


def build_tunix_model(config, params, *, fix_rope: bool):
    """Tunix's Llama3 with ``config``'s shapes holding ``params`` (our pytree, float32)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx, traverse_util
    from tunix.models.llama3 import model as tm

    _check_supported(config)
    tcfg = tm.ModelConfig(
        num_layers=config.num_layers,
        vocab_size=config.vocab_size,
        embed_dim=config.hidden_size,
        hidden_dim=config.intermediate_size,
        num_heads=config.num_heads,
        head_dim=config.head_dim,
        num_kv_heads=config.num_kv_heads,
        rope_theta=config.rope_theta,
        norm_eps=config.rms_norm_eps,
        shd_config=tm.ShardingConfig.get_default_sharding(is_sampling=True),
        weight_tying=config.tie_embeddings,
    )
    if fix_rope and not isinstance(tm.apply_rope, functools.partial):
        # Tunix 0.1.7's Attention calls apply_rope(..., head_dim=...) without rope_theta.
        tm.apply_rope = functools.partial(tm.apply_rope, rope_theta=config.rope_theta)
    abstract = nnx.eval_shape(lambda: tm.Llama3(tcfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    target = traverse_util.flatten_dict(nnx.to_pure_dict(state))
    lay = params["layers"]
    ours = {
        ("embedder", "input_embedding"): params["embed"]["embedding"],
        ("final_norm", "w"): params["final_norm"]["scale"],
    }
    if not config.tie_embeddings:
        ours[("lm_head", "w")] = params["lm_head"]["kernel"]
    per_layer = {
        ("attn", "q_proj", "w"): lay["q_proj"]["kernel"],
        ("attn", "k_proj", "w"): lay["k_proj"]["kernel"],
        ("attn", "v_proj", "w"): lay["v_proj"]["kernel"],
        ("attn", "o_proj", "w"): lay["o_proj"]["kernel"],
        ("mlp", "gate_proj", "kernel"): lay["gate_proj"]["kernel"],
        ("mlp", "up_proj", "kernel"): lay["up_proj"]["kernel"],
        ("mlp", "down_proj", "kernel"): lay["down_proj"]["kernel"],
        ("input_layernorm", "w"): lay["attn_norm"]["scale"],
        ("post_attention_layernorm", "w"): lay["mlp_norm"]["scale"],
    }
    host = {k: np.asarray(v) for k, v in per_layer.items()}
    for i in range(config.num_layers):
        for k, v in host.items():
            ours[("layers", i, *k)] = v[i]
    filled = {}
    for path, spec in target.items():
        key = tuple(int(p) if isinstance(p, str) and p.isdigit() else p for p in path)
        if key not in ours:
            raise SystemExit(f"no weight of ours for Tunix parameter {path}")
        value = jnp.asarray(ours.pop(key), dtype=spec.dtype)
        if value.shape != spec.shape:
            raise SystemExit(f"{path}: Tunix expects {spec.shape}, ours is {value.shape}")
        filled[path] = value
    if ours:
        raise SystemExit(f"weights of ours with no Tunix parameter: {sorted(ours)[:5]}")
    nnx.replace_by_pure_dict(state, traverse_util.unflatten_dict(filled))
    model = nnx.merge(graphdef, state)
    jax.block_until_ready(nnx.state(model))
    return model, tcfg


def make_sampler(model, config, cache_size: int):
    from tunix.generate import sampler as ts

    return ts.Sampler(
        transformer=model,
        tokenizer=IdTokenizer(),
        cache_config=ts.CacheConfig(
            cache_size=cache_size,
            num_layers=config.num_layers,
            num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
        ),
    )


TUNIX_MODES = {
    "greedy": dict(temperature=0.0, top_p=None),
    "sampling": dict(temperature=1.0, top_p=0.95, top_k=None),
}


def run_tunix(sampler, rows: list[list[int]], p_len: int, m: int, mode: str, seed: int = 0):
    """Tunix's Sampler on token-id rows (each of length P): ``[rows, M]`` int tokens."""
    import numpy as np

    out = sampler(
        [" ".join(map(str, r)) for r in rows],
        max_generation_steps=m,
        max_prompt_length=p_len,
        echo=False,
        eos_tokens=[EOS_ID],
        seed=seed,
        **TUNIX_MODES[mode],
    )
    lens = {len(t) for t in out.tokens}
    if lens != {m}:
        raise SystemExit(f"Tunix returned rows of lengths {sorted(lens)}, expected all {m}")
    return np.stack([np.asarray(t) for t in out.tokens])


def ours_greedy(params, config, prompts, m: int):
    """Our static engine's greedy tokens ``[B, M]`` (stop tokens off)."""
    import numpy as np

    from jaxrl_llm.sampling import SamplingConfig, pad_prompts, rollout

    tokens, mask = pad_prompts(prompts, length=len(prompts[0]))
    out = rollout(
        params,
        tokens,
        mask,
        config=config,
        sampling=SamplingConfig(greedy=True, use_model_eos=False),
        num_samples=1,
        max_new_tokens=m,
        gen_len=m,
    )
    return np.asarray(out.tokens)


def ours_greedy_paged(params, config, prompts, m: int, args):
    import numpy as np

    from jaxrl_llm.sampling import SamplingConfig
    from jaxrl_llm.sampling.paged_generate import generate_paged

    out = generate_paged(
        params,
        config,
        prompts,
        sampling=SamplingConfig(greedy=True, use_model_eos=False),
        num_samples=1,
        max_new_tokens=m,
        num_slots=max(len(prompts), 1),
        page_size=args.page_size,
        chunk_steps=args.chunk_steps,
    )
    return np.asarray(out.tokens)[:, :m]


def main(argv=None) -> int:
    args = _parse(argv)
    warnings.filterwarnings("ignore", category=DeprecationWarning)  # Tunix's _init_cache path
    from importlib import metadata

    import numpy as np

    config, params, _ = common.load_model(args.model)
    tunix_version = metadata.version("google-tunix")
    common.log(f"tunix {tunix_version}; model {args.model}; building Tunix Llama3 ...")
    model, _ = build_tunix_model(config, params, fix_rope=not args.tunix_rope_as_is)
    b, g, p_len, m = args.prompts, args.group, args.prompt_len, args.new_tokens
    rng = np.random.default_rng(0)
    low = 3 if config.vocab_size > 3 else 0
    prompts = [rng.integers(low, config.vocab_size, size=p_len).tolist() for _ in range(b)]
    body: list[str] = []
    metrics: dict[str, float] = {}

    # ----- greedy token check: Tunix vs our static and paged engines -----------------------
    n_chk, m_chk = min(args.check_rows, b), min(args.check_new_tokens, m)
    chk_prompts = prompts[:n_chk]
    chk_sampler = make_sampler(model, config, p_len + m_chk)
    t_tok = run_tunix(chk_sampler, chk_prompts, p_len, m_chk, "greedy")
    o_tok = ours_greedy(params, config, chk_prompts, m_chk)
    pg_tok = ours_greedy_paged(params, config, chk_prompts, m_chk, args)
    same_static = bool(np.array_equal(t_tok, o_tok))
    same_paged = bool(np.array_equal(t_tok, pg_tok))
    check = (
        f"Greedy token check ({n_chk} prompts × {m_chk} new tokens, {p_len}-token prompts): "
        f"Tunix {'==' if same_static else '!='} our static engine, Tunix "
        f"{'==' if same_paged else '!='} our paged engine"
        + (
            ""
            if same_static and same_paged
            else f" (Tunix {t_tok.tolist()}, ours {o_tok.tolist()})"
        )
        + "."
    )
    common.log(check)
    metrics["greedy_check_equal"] = float(same_static and same_paged)
    rope_note = (
        "Tunix's RoPE base left as is (1e6)."
        if args.tunix_rope_as_is
        else f"Tunix's apply_rope bound to the model's RoPE base ({config.rope_theta:g}); "
        "Tunix 0.1.7's Llama3 ignores ModelConfig.rope_theta (uses 1e6)."
    )
    body += [
        f"Model: {args.model} ({common.fmt_params(config.num_params())} parameters), our "
        f"weights copied into Tunix {tunix_version}'s `tunix.models.llama3` Llama3. " + rope_note,
        "",
        check,
        "",
    ]
    if args.check_only:
        return common.report(
            args.out,
            __file__,
            argv,
            title="Tunix sampler: greedy token check",
            body=body,
            metrics=metrics,
        )

    # ----- timing: workload (a) ---------------------------------------------------------------
    from jaxrl_llm.sampling import PagedEngine, SamplingConfig, pad_prompts, rollout

    rows_in = [pr for pr in prompts for _ in range(g)]  # prompt-major, G copies each
    sampler = make_sampler(model, config, p_len + m)
    useful = float(b * g * m)
    ours_modes = {
        "greedy": SamplingConfig(greedy=True, use_model_eos=False),
        "sampling": SamplingConfig(temperature=1.0, top_p=0.95, use_model_eos=False),
    }
    tokens, mask = pad_prompts(prompts, length=p_len)
    table: list[list[str]] = []
    modes = [x.strip() for x in args.modes.split(",") if x.strip()]
    for mode in modes:
        got: dict[str, float] = {}
        outs: dict[str, np.ndarray] = {}

        def tunix_run(mode=mode):
            outs["tunix"] = run_tunix(sampler, rows_in, p_len, m, mode)

        runs = [("Tunix Sampler (float32)", tunix_run)]
        if args.with_ours:
            s = ours_modes[mode]

            def static(s=s):
                out = rollout(
                    params,
                    tokens,
                    mask,
                    config=config,
                    sampling=s,
                    num_samples=g,
                    max_new_tokens=m,
                    gen_len=m,
                )
                out.tokens.block_until_ready()
                outs["static"] = np.asarray(out.tokens)

            def paged(s=s):
                eng = PagedEngine(
                    params,
                    config,
                    sampling=s,
                    num_slots=max(min(args.num_slots, b * g), g),  # no idle slots in (a)
                    page_size=args.page_size,
                    max_len=p_len + m,
                    gen_len=m,
                    chunk_steps=args.chunk_steps,
                )
                for i, pr in enumerate(prompts):
                    eng.submit(pr, prompt_id=i, num_samples=g, max_new_tokens=[m] * g)
                eng.run()

            runs += [("static engine (float32)", static), ("paged engine (float32)", paged)]
        for what, fn in runs:
            first = common.timed_first_call(fn)
            t = common.best_time(fn, args.repeats)
            got[what] = useful / t
            table.append(["a", mode, what, f"{useful / t:,.1f}", f"{t:.3f}", f"{first:.1f}"])
            common.log(table[-1])
        key = f"a_{mode}"
        for what, tps in got.items():
            metrics[f"{key}_{what.split(' (')[0].replace(' ', '_').lower()}_tokens_per_s"] = tps
        tunix_tps = got["Tunix Sampler (float32)"]
        if args.with_ours:
            metrics[f"{key}_static_over_tunix"] = got["static engine (float32)"] / tunix_tps
            metrics[f"{key}_paged_over_tunix"] = got["paged engine (float32)"] / tunix_tps
            if mode == "greedy":
                agree = float(np.mean(outs["tunix"] == outs["static"]))
                first_diff = [
                    int(np.argmax(r != q)) if (r != q).any() else m
                    for r, q in zip(outs["tunix"], outs["static"])
                ]
                metrics["a_greedy_tunix_static_token_agreement"] = agree
                same = sum(d == m for d in first_diff)
                body_note = (
                    f"Greedy (a), all {b * g}×{m} tokens: Tunix and our static engine agree on "
                    f"{agree:.1%} of tokens, {same}/{b * g} rows identical"
                    + (
                        "."
                        if same == b * g
                        else f"; the earliest divergence is at step {min(first_diff)} (float32 "
                        "rounding differs between the two implementations, so a long greedy "
                        "run can part at a near-tie and then differ everywhere after)."
                    )
                )
                common.log(body_note)
    body += [
        f"Workload (a): {b} prompts × G={g} ({b * g} rows; Tunix gets each prompt G times), "
        f"{p_len}-token random prompts, {m} new tokens per row (no stop tokens: Tunix's EOS "
        f"and pad ids are -2 / -1, never sampled), float32; greedy and sampling (τ = 1, "
        f"top-p 0.95, no top-k). Best of {args.repeats} after an untimed warm-up (compile) "
        f"call; tokens/s = {b * g}·{m} useful tokens / seconds. Tunix's time is one "
        f"`Sampler.__call__` (host tokenisation of the id strings and the device-to-host copy "
        f"of the tokens included; detokenisation is a no-op).",
        "",
        *common.markdown_table(
            ["workload", "mode", "engine", "tokens/s", "seconds", "first call s"],
            table,
            align="lllrrr",
        ),
        "",
        *[f"{k}: {v:.2f}×" for k, v in metrics.items() if "_over_" in k],
    ]
    if args.with_ours and "greedy" in modes:
        body += ["", body_note]
    return common.report(
        args.out,
        __file__,
        argv,
        title="Tunix's sampler vs our engines on workload (a)",
        body=body,
        metrics=metrics,
    )


if __name__ == "__main__":
    sys.exit(main())
