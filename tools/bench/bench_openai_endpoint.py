"""The OpenAI-compatible endpoint's overhead: C concurrent chat requests through the ``openai``
SDK against the same rows submitted straight to a paged engine of the same shape.

Both sides decode the same prompts (the chat template's rendering of C questions), one sample
each, ``--tokens`` new tokens (no stop token: the tiny random model's rows all run their whole
budget), on engines with C slots. The direct side runs once to compile, the endpoint
``--warmup`` rounds (requests arrive in groups of varying size, and each new number of groups
admitted together compiles its own prefill program), then ``--repeats`` timed runs each; the
line printed is the best time of each and their ratio (endpoint / direct).

Example::

    python tools/bench/bench_openai_endpoint.py --concurrency 64 --tokens 32
"""

from __future__ import annotations

import argparse
import concurrent.futures
import time

import jax


def main() -> None:
    """Run the benchmark and print one line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--warmup",
        type=int,
        default=4,
        help="untimed rounds (each new number of requests admitted together compiles a prefill)",
    )
    args = ap.parse_args()

    import openai

    from jaxrl_llm.data import CharTokenizer
    from jaxrl_llm.models import ModelConfig, init_params
    from jaxrl_llm.sampling import PagedEngine, SamplingConfig
    from jaxrl_llm.serve import EngineLoop, ServerThread, make_app
    from jaxrl_llm.serve.openai import endpoint
    from jaxrl_llm.serve.served import ServedModel

    tok = CharTokenizer()
    # no EOS among the ids the model can draw: every row runs its whole budget on both sides
    config = ModelConfig.tiny(vocab_size=259, eos_token_ids=(258,), pad_token_id=0)
    params = init_params(config, jax.random.PRNGKey(0))
    c, m = args.concurrency, args.tokens
    questions = [f"{i % 10}{(7 * i) % 10}>" for i in range(c)]
    messages = [[{"role": "user", "content": q}] for q in questions]
    prompts = [
        tok.apply_chat_template(x, add_generation_prompt=True, tokenize=True) for x in messages
    ]
    shape = dict(num_slots=c, page_size=16, max_len=64, chunk_steps=16)
    sampling = SamplingConfig(temperature=1.0, stop_token_ids=(), use_model_eos=False)

    def direct() -> float:
        eng = PagedEngine(params, config, sampling=sampling, gen_len=m, **shape)
        t0 = time.perf_counter()
        for i, p in enumerate(prompts):
            eng.submit(p, prompt_id=i, max_new_tokens=m)
        eng.run()
        return time.perf_counter() - t0

    loop = EngineLoop().start()
    try:
        ep = endpoint(ServedModel("tiny", config, params, tok, "tiny"), loop, max_tokens=m, **shape)
        ep.generator.forced = sampling
        with ServerThread(make_app([ep.protocol])) as s:
            client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0)

            def one(msgs):
                return client.chat.completions.create(model="tiny", messages=msgs, max_tokens=m)

            def served() -> float:
                t0 = time.perf_counter()
                with concurrent.futures.ThreadPoolExecutor(c) as pool:
                    replies = list(pool.map(one, messages))
                assert all(r.usage.completion_tokens == m for r in replies)
                return time.perf_counter() - t0

            direct()  # compile
            for _ in range(args.warmup):
                served()
            d = min(direct() for _ in range(args.repeats))
            e = min(served() for _ in range(args.repeats))
            groups = loop.groups["openai.admit"]
    finally:
        loop.stop()
    print(
        f"{c} concurrent chat requests x {m} tokens (tiny model, CPU {jax.device_count()} "
        f"devices): direct engine {d:.2f} s, endpoint {e:.2f} s, ratio {e / d:.2f} "
        f"({groups} admission groups over {args.warmup + args.repeats} endpoint rounds)"
    )


if __name__ == "__main__":
    main()
