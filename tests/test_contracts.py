import pytest
from pydantic import ValidationError

from raas.contracts import (
    GenerateRequest,
    RolloutRequest,
    Status,
    Trajectory,
    TrajectoryError,
    Turn,
)


def traj(**kw):
    base = dict(
        id="r-1", group_id="g-1", task_id="t", env="calculator",
        tokens=[5, 6, 7, 8], loss_mask=[0, 0, 1, 1], logprobs=[0.0, 0.0, -0.5, -1.25], versions=[-1, -1, 3, 4],
        turns=[Turn(role="user", text="q", span=(0, 2)), Turn(role="assistant", text="a", span=(2, 4))],
    )
    base.update(kw)
    return Trajectory(**base)


def test_valid_trajectory_round_trips_through_json():
    t = traj(reward=1.0, metrics={"correct": True})
    back = Trajectory.model_validate_json(t.model_dump_json())
    assert back == t
    assert back.num_sampled == 2 and back.min_version == 3 and back.sampled_versions == [3, 4]


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("loss_mask", [0, 0, 1], "loss_mask has 3 entries"),
        ("logprobs", [0.0, 0.0, -0.5], "logprobs has 3 entries"),
        ("versions", [-1, -1, 3], "versions has 3 entries"),
        ("loss_mask", [0, 2, 1, 1], "loss_mask[1] is 2"),
        ("logprobs", [0.0, -0.1, -0.5, -1.25], "not sampled"),
        ("versions", [-1, -1, -1, 4], "sampled but has version -1"),
        ("logprobs", [0.0, 0.0, 0.5, -1.25], "sampled but has version 3 / logprob 0.5"),
        ("turns", [Turn(role="assistant", text="a", span=(2, 9))], "outside tokens"),
        ("turns", [Turn(role="assistant", text="a", span=(1, 4), sampled=True)], "covers unsampled tokens"),
    ],
)
def test_invariants_are_enforced(field, value, needle):
    with pytest.raises(ValidationError) as e:
        traj(**{field: value})
    assert needle in str(e.value)


def test_failed_status_needs_error():
    with pytest.raises(ValidationError, match="needs an error"):
        traj(status=Status.failed)
    t = traj(status=Status.failed, error=TrajectoryError(stage="run", type="X", message="boom"))
    assert Trajectory.model_validate_json(t.model_dump_json()).error.stage == "run"


def test_rollout_request_defaults_and_extra_task_fields():
    r = RolloutRequest.model_validate({"task": {"env": "calculator", "seed": 7}, "n": 4})
    assert r.task.instance() == {"seed": 7}
    assert r.sampling.temperature == 1.0 and r.agent.max_turns >= 1
    back = RolloutRequest.model_validate_json(r.model_dump_json())
    assert back.task.instance() == {"seed": 7} and back.n == 4


@pytest.mark.parametrize(
    "body,loc",
    [
        ({"task": {"env": "c"}, "n": 0}, "n"),
        ({"task": {"env": "c"}, "sampling": {"top_p": 0}}, "top_p"),
        ({"task": {}}, "env"),
        ({"task": {"env": "c"}, "bogus": 1}, "bogus"),
    ],
)
def test_rollout_request_rejects_bad_fields(body, loc):
    with pytest.raises(ValidationError) as e:
        RolloutRequest.model_validate(body)
    assert loc in str(e.value)


def test_generate_request_needs_tokens():
    with pytest.raises(ValidationError):
        GenerateRequest(prompt_token_ids=[])
