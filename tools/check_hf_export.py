"""Load a Hugging Face export with transformers and greedy-answer one prompt (a smoke check).

Usage: python tools/check_hf_export.py RUN_DIR/hf
"""

import sys


def main(path: str) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k != "error_msgs"}
    tok = AutoTokenizer.from_pretrained(path)
    msgs = [{"role": "user", "content": "What is 37 + 45? Reply with just the number."}]
    ids = tok.apply_chat_template(
        msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=16, do_sample=False)
    text = tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    n = sum(p.numel() for p in model.parameters())
    print(f"transformers loads {path}: {n / 1e6:.1f}M parameters, loading issues: {bad or 'none'}")
    print(f"  'What is 37 + 45?' -> {text!r}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
