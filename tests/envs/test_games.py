"""The built-in games: single_turn ends after one answer; guess_number answers higher / lower /
correct with its rewards."""

from jaxrl_llm.envs import ENVIRONMENTS, GuessNumberEnv, SingleTurnEnv, Step


def test_builtins_are_registered():
    assert set(ENVIRONMENTS) == {"single_turn", "tools", "guess_number"}


def test_single_turn():
    env = SingleTurnEnv()
    assert env.reset({"prompt": "hi"}) == [{"role": "user", "content": "hi"}]
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    assert env.reset({"prompt": chat}) == chat
    assert env.step("anything") == Step(done=True)


def test_guess_number_feedback_and_rewards():
    env = GuessNumberEnv(low=1, high=100, win_reward=1.0, turn_cost=0.1)
    opening = env.reset({"prompt": None, "answer": 37})
    assert "between 1 and 100" in opening[0]["content"]
    s = env.step("I guess 50")
    assert s.messages == [{"role": "user", "content": "lower"}] and not s.done
    assert s.reward == -0.1
    s = env.step("20?")
    assert s.messages[0]["content"] == "higher"
    s = env.step("no idea")
    assert s.messages[0]["content"] == "Answer with one number." and s.info == {"no_guess": 1}
    s = env.step("It is 37")
    assert s.done and s.reward == 0.9 and s.info == {"wins": 1}
    # without an answer column the secret is the middle of the range
    env = GuessNumberEnv(low=10, high=20)
    env.reset({"prompt": "Guess my number (10..20)."})
    assert env.step("15").done
