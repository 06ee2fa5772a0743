"""The trainer's reward calls carry TRL's ``trainer_state`` (the step being trained) and the
sampled ``completion_ids`` (not the texts re-encoded), on the ``jaxrl-llm train`` path."""

from tests.train.test_producer import main_job, run

SEEN: list[tuple[int, list[list[int]], list[str]]] = []


def recording_reward(completions, completion_ids, trainer_state, **kwargs):
    """Records what it was called with; scores every row 0."""
    SEEN.append((trainer_state.step, completion_ids, completions))
    return [0.0] * len(completions)


def test_steps_and_sampled_ids_reach_the_reward(tmp_path):
    SEEN.clear()
    reward = "rewards=[{name: 'tests.train.test_reward_state:recording_reward'}]"
    cfg = main_job(tmp_path / "r", reward, steps=2)
    run(cfg)
    assert [step for step, _, _ in SEEN] == [1, 2]
    for _, ids, texts in SEEN:
        assert len(ids) == len(texts) == 4 * cfg.rollout.group_size
        assert all(1 <= len(row) <= cfg.rollout.max_new_tokens for row in ids)
        # the char tokenizer re-encodes a text into more ids than were sampled: these are
        # the sampled ones, at most max_new_tokens per row
        assert all(isinstance(t, int) for row in ids for t in row)
