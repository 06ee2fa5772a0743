"""The multi-process harness's reference cache (tests/train/harness.py) shares a reference run
only between configs that train alike: where a run writes, how often it checkpoints and where
its data lie do not matter; the data's contents and every other setting do."""

from tests.train import harness


def test_reference_key_ignores_where_and_checkpoints_but_not_what(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    ca = harness.online_config(a, "grpo", max_steps=4)
    cb = harness.edit_config(
        harness.online_config(b, "grpo", max_steps=4),
        checkpoint=dict(save_every=2, keep=2, export_hf=False),
        output_dir=str(b / "run"),
    )
    assert harness._reference_key(ca, ()) == harness._reference_key(cb, ())
    # another setting, another override, other data: another reference
    assert harness._reference_key(ca, ()) != harness._reference_key(ca, ("optim.lr=0.1",))
    harness.edit_config(cb, rollout=dict(max_staleness=1))
    assert harness._reference_key(ca, ()) != harness._reference_key(cb, ())
    c = tmp_path / "c"
    c.mkdir()
    cc = harness.online_config(c, "grpo", max_steps=4)
    assert harness._reference_key(ca, ()) == harness._reference_key(cc, ())
    (c / "train.jsonl").write_text((c / "train.jsonl").read_text().replace(">", "?"))
    assert harness._reference_key(ca, ()) != harness._reference_key(cc, ())
