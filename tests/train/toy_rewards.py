"""Reward functions for the toy online-RL tests (importable as tests.train.toy_rewards)."""


def larger_digit(prompts, completions, *, answer, **_):
    """1 if the reply starts with the larger digit, 0.25 if it starts with any digit, else 0.
    A conversational row's completion arrives as TRL passes it, a message list."""
    out = []
    for text, ref in zip(completions, answer):
        if isinstance(text, list):  # [{"role": "assistant", "content": ...}]
            text = "".join(m["content"] for m in text)
        text = text.strip()
        if text[:1] == str(ref):
            out.append(1.0)
        elif text[:1].isdigit():
            out.append(0.25)
        else:
            out.append(0.0)
    return out


def flaky(prompts, completions, *, answer, **_):
    """Raises when a prompt starts with 0, NaN when it starts with 1, else larger_digit."""
    out = []
    for p, c, a in zip(prompts, completions, answer):
        if p.startswith("0"):
            raise RuntimeError("flaky reward")
        out.append(float("nan") if p.startswith("1") else larger_digit([p], [c], answer=[a])[0])
    return out
