"""The sampler's decode-step model (``jaxrl_llm/parallel/decode_model.py``): without a chip
model (CPU devices) ``rollout.tensor: auto`` takes the smallest degree whose copy and KV cache
fit the memory left, and says why when none does (issue 54 item 4)."""

from jaxrl_llm.parallel.decode_model import auto_tensor, choose_sampler_tensor
from jaxrl_llm.train.compile.memory_presets import MODEL_PRESETS

# a 7B-sized model in float32 (the CPU sampler's dtype): 28 GB of weights, 32 layers
SEVEN_B = dict(devices=8, weight_bytes=28e9, kv_bytes_per_row=0.5e9, rows=16, layers=32)


def test_cpu_takes_the_smallest_degree_that_fits():
    # 25 GB left per device: tensor=1 holds 28 GB + 2 rows' KV, tensor=2 half of that
    t, why, costs = choose_sampler_tensor(
        [1, 2, 4, 8], None, hidden=4096, free_bytes=25e9, **SEVEN_B
    )
    assert t == 2 and "fit" in why and "CPU" in why
    assert [c.fits for c in costs] == [False, True, True, True]
    # without a budget: the smallest degree, as before
    assert choose_sampler_tensor([1, 2, 4, 8], None, hidden=4096, **SEVEN_B)[0] == 1


def test_cpu_says_why_when_no_degree_fits():
    t, why, costs = choose_sampler_tensor(
        [1, 2, 4, 8], None, hidden=4096, free_bytes=1e9, **SEVEN_B
    )
    assert t == 8 and "no degree fits" in why and not any(c.fits for c in costs)


def test_auto_tensor_for_a_7b_model_on_8_cpu_devices():
    # jaxrl-llm memory --model 7b --algorithm grpo --mesh fsdp=8 on 8 CPU devices: with 20 GB
    # per device left, a whole float32 copy per device (tensor=1: 27 GB of weights) does not
    # fit; at tensor=2 the weights (13.5 GB) and 16 rows' KV (8.6 GB) do not either; tensor=4
    config = MODEL_PRESETS["7b"]
    kw = dict(devices=8, local_devices=8, rows=64, tokens=1024, chip=None, dtype="float32")
    t, why = auto_tensor(config, free_bytes=20e9, **kw)
    assert config.num_params() * 4 > 20e9
    assert t == 4 and "tensor=4" in why and "fit" in why
    assert auto_tensor(config, free_bytes=None, **kw)[0] == 1  # no budget: as before
