"""One role vocabulary (issue 51): the placement and the memory estimate name a run's models
with the same :class:`jaxrl_llm.parallel.roles.Role`."""

from jaxrl_llm.parallel import placement
from jaxrl_llm.parallel.roles import PLACED_ROLES, Role
from jaxrl_llm.train.compile import memory_rows
from jaxrl_llm.train.compile.memory import ALGORITHM_MEMORY


def test_placement_and_memory_share_one_role_type():
    assert memory_rows.Role is Role
    assert placement.ROLES == ("learner", "sampler", "reference", "teacher", "critic")
    assert all(Role(name) in PLACED_ROLES for name in placement.ROLES)


def test_every_model_an_algorithm_holds_is_a_role_the_learner_trains_one():
    held = {r for m in ALGORITHM_MEMORY.values() for r in m.roles}
    assert held <= set(Role) and Role.SAMPLER not in held
    assert ALGORITHM_MEMORY["grpo"].trainable == (Role.LEARNER,)
    assert ALGORITHM_MEMORY["reward_model"].trainable == (Role.REWARD,)
    assert ALGORITHM_MEMORY["ppo"].roles[:3] == (Role.LEARNER, Role.REFERENCE, Role.CRITIC)
