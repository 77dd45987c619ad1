"""Curve shapes: the classifier on synthetic logs of every shape, the log readers, the sparkline and
the `nnwizard curve` command (terminal, --json, --report)."""

from __future__ import annotations

import json
import math
import random

import pytest

from nnwizard.curves import Curves, classify, pick_columns, read_log, sparkline


def _logs(seed: int = 0) -> dict[str, tuple[list[float], list[float] | None]]:
    r = random.Random(seed)
    n = 200
    decay = [0.3 + 1.1 * math.exp(-i / 25) + r.gauss(0, 0.02) for i in range(n)]
    over_train = [1.4 * math.exp(-i / 40) + 0.02 + r.gauss(0, 0.02) for i in range(300)]
    over_val = [0.6 + 0.5 * math.exp(-e / 3) + max(0, e - 8) * 0.06 for e in range(30)]
    return {
        "flat": ([1.386 + r.gauss(0, 0.004) for _ in range(n)], None),
        "nan": ([2.3, 2.31, 2.29] + [float("nan")] * 20, None),
        "oscillating": ([abs(2 + r.gauss(0, 1.5)) * (1 + 3 * (r.random() < 0.2)) for _ in range(n)], None),
        "plateau": (decay, None),
        "falling": ([1.4 - 0.005 * i + r.gauss(0, 0.02) for i in range(n)], None),
        "diverged": (decay[:150] + [0.4 * 1.6 ** k for k in range(1, 15)] + [float("inf"), float("nan")], None),
        "stalled-high": ([1.0 + 0.4 * math.exp(-i / 10) + r.gauss(0, 0.03) for i in range(n)], None),
        "overfitting": (over_train, over_val),
    }


@pytest.mark.parametrize("shape", list(_logs()))
def test_each_shape_is_recognised(shape):
    for seed in range(3):  # not one lucky draw of the noise
        train, val = _logs(seed)[shape]
        vsteps = [(e + 1) * 10 - 1 for e in range(len(val))] if val else None
        result = classify(Curves(train, val=val, val_steps=vsteps))
        assert result.shape == shape, (seed, result.shape, result.evidence)
        assert result.intervention and result.lr


def test_event_steps_and_symptoms():
    logs = _logs()
    nan = classify(Curves(logs["nan"][0]))
    assert nan.step == 3 and nan.symptoms == ["nan"]
    div = classify(Curves(logs["diverged"][0]))
    assert div.step == 164 and "diverged" in div.shape
    train, val = logs["overfitting"]
    over = classify(Curves(train, val=val, val_steps=[(e + 1) * 10 - 1 for e in range(30)]))
    assert over.symptoms == ["overfitting"] and over.data["best_step"] in (69, 79, 89)
    assert classify(Curves(logs["stalled-high"][0])).symptoms == ["underfitting"]
    assert classify(Curves(logs["plateau"][0])).normal and classify(Curves(logs["plateau"][0])).symptoms == []
    assert classify(Curves([1.0, 0.9])).shape == "too-short"
    short = classify(Curves([7.6e4, float("inf")]))  # a run that blows up at once is short *and* NaN
    assert short.shape == "nan" and short.step == 1


def test_lr_advice_differs_between_flat_and_nan():
    flat, nan = classify(Curves(_logs()["flat"][0])), classify(Curves(_logs()["nan"][0]))
    assert "Raising" in flat.lr and "Lowering" in nan.lr


def test_reference_scale_changes_what_counts_as_high():
    train = [1.0 + 0.4 * math.exp(-i / 10) for i in range(200)]
    assert classify(Curves(train)).shape == "stalled-high"
    # the same curve is a low plateau when chance level is 20 (e.g. a loss summed over a sequence)
    assert classify(Curves(train), reference=20.0).shape in ("plateau", "flat")


def test_pick_columns():
    cols = pick_columns(["epoch", "step", "train/loss", "val/loss", "val/acc", "lr"])
    assert cols == {"step": "step", "train": "train/loss", "val": "val/loss", "val_acc": "val/acc"}
    assert pick_columns(["iteration", "loss", "valid_loss"])["val"] == "valid_loss"


def test_readers(tmp_path):
    csv = tmp_path / "log.csv"
    csv.write_text("step,loss,val_loss\n0,2.0,\n1,1.5,\n2,nan,1.7\n3,inf,\n")
    c = read_log(csv)
    assert c.train[:2] == [2.0, 1.5] and math.isnan(c.train[2]) and math.isinf(c.train[3])
    assert c.val == [1.7] and c.val_steps == [2.0]
    jl = tmp_path / "log.jsonl"
    jl.write_text("\n".join(json.dumps({"global_step": i, "loss": 1.0 / (i + 1)}) for i in range(5)))
    assert read_log(jl).train == [1.0, 0.5, 1 / 3, 0.25, 0.2]
    js = tmp_path / "log.json"
    js.write_text(json.dumps({"loss": [3, 2, 1], "val_loss": [3.5, 2.5, 2.0]}))
    assert read_log(js).val == [3.5, 2.5, 2.0]
    plain = tmp_path / "losses.txt"
    plain.write_text("1\n0.5\n0.25\n")
    assert read_log(plain).train == [1.0, 0.5, 0.25]
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="no loss column"):
        read_log(bad)


def test_tensorboard_events(tmp_path):
    tb = pytest.importorskip("torch.utils.tensorboard")
    pytest.importorskip("tensorboard")
    writer = tb.SummaryWriter(str(tmp_path))
    for i in range(50):
        writer.add_scalar("train/loss", 1.386 + (0.001 if i % 2 else 0.0), i)
    writer.close()
    assert classify(read_log(tmp_path)).shape == "flat"


def test_sparkline():
    line = sparkline([1, 2, 3, float("nan")])
    assert line[0] == "▁" and line[2] == "█" and line[-1] == "×"
    assert len(sparkline(list(range(500)), width=40)) == 40


def test_curve_command(tmp_path):
    from typer.testing import CliRunner

    from nnwizard.cli import app

    train, val = _logs()["overfitting"]
    log = tmp_path / "run.jsonl"
    rows = [{"step": i, "loss": v} for i, v in enumerate(train)]
    for e, v in enumerate(val):
        rows[(e + 1) * 10 - 1]["val_loss"] = v
    log.write_text("\n".join(json.dumps(r) for r in rows))
    out_json, out_md = tmp_path / "c.json", tmp_path / "c.md"
    result = CliRunner().invoke(app, ["curve", str(log), "--json", str(out_json), "--report", str(out_md)])
    assert result.exit_code == 0, result.output
    assert "train falls while validation rises" in result.output and "▁" in result.output
    data = json.loads(out_json.read_text())
    assert data["shape"] == "overfitting" and data["symptoms"] == ["overfitting"] and data["step"] in (69, 79, 89)
    assert "![loss curve]" in out_md.read_text() and list((tmp_path / "c_files").glob("*.png"))
    missing = CliRunner().invoke(app, ["curve", str(tmp_path / "nope.csv")])
    assert missing.exit_code != 0


def test_a_finite_divergence_is_not_measured_as_nan():
    decay = [1.4 * math.exp(-i / 8) + 0.1 for i in range(40)]
    finite = classify(Curves(decay + [30.0 * (1 + 0.1 * (k % 3)) for k in range(15)]))
    assert finite.shape == "diverged" and finite.symptoms == ["oscillating"]  # every value is finite
    blown = classify(Curves(decay + [30.0, 900.0, float("inf")]))
    assert blown.shape == "diverged" and blown.symptoms == ["nan"]


def test_a_blow_up_at_the_start_that_the_run_only_undid_is_oscillation_not_progress():
    """nanoGPT at lr 0.5: 4.56 before any update, 37 two steps later, back to ~5 after 60 steps. The
    median of the first three points (12.4) made it read as 'still falling'."""
    r = random.Random(0)
    blown = [4.558, 12.38, 37.25, 30.02, 25.48, 16.69, 18.91, 31.53, 30.44] + \
        [4.6 + 25 * math.exp(-i / 8) + r.gauss(0, 0.3) for i in range(51)]
    shape = classify(Curves(blown))
    assert shape.shape == "oscillating" and shape.symptoms == ["oscillating"], shape.evidence
    assert shape.data["first"] == 4.558 and shape.data["peak"] == 37.25 and shape.step == 2
    assert "4.558" in shape.evidence and "37.25" in shape.evidence
    # the same blow-up in a run that goes on to learn well below where it began: not this shape
    learns = [4.558, 12.38, 37.25] + [0.5 + 30 * math.exp(-i / 5) + r.gauss(0, 0.05) for i in range(57)]
    assert classify(Curves(learns)).shape != "oscillating"
    # a first step or two above the first value (minibatch noise, under 2x) is an ordinary start
    noisy = [2.30, 3.1, 2.9] + [2.3 * math.exp(-i / 30) + 0.2 + r.gauss(0, 0.03) for i in range(57)]
    assert classify(Curves(noisy)).normal


def test_an_early_blow_up_the_run_recovers_from_is_a_spike_not_normal_progress():
    """A hand-written warm-up to a peak rate 100x too high over 200 steps: 2.73 before any update, 18.7 three
    steps later, back below the start after ~25 steps, 1.5 at the end (the intended rate ends near 0.6). Read
    over the whole run the fall looks normal; the first updates overshoot."""
    r = random.Random(1)
    spiked = [2.73, 6.83, 12.33, 18.71, 12.98, 11.96, 6.19, 5.26, 5.44, 4.31, 3.16, 3.18] + \
        [2.9 - 1.4 * (1 - math.exp(-i / 80)) + r.gauss(0, 0.08) for i in range(188)]
    shape = classify(Curves(spiked))
    assert shape.shape == "spiked" and not shape.normal and shape.symptoms == ["oscillating"], shape.evidence
    assert shape.step == 3 and shape.data["peak_ratio"] == pytest.approx(18.71 / 2.73)
    assert "18.71" in shape.evidence and "2.73" in shape.evidence
    # the same run without the blow-up is normal, and a curve that jumps all along stays oscillating
    assert classify(Curves([2.73] + spiked[12:])).normal


def test_a_loss_below_zero_that_falls_ever_faster_is_unbounded_not_normal():
    climbing = [-10.0 - 0.05 * i * i for i in range(60)]          # the objective maximised the wrong way round
    shape = classify(Curves(climbing))
    assert shape.shape == "unbounded" and not shape.normal, shape.evidence
    # a loss that goes below zero and slows down (a Gaussian NLL with a learned scale) is ordinary progress
    bounded = [-1.0 - 2.0 * (1 - 0.93 ** i) for i in range(60)]
    assert classify(Curves(bounded)).shape in ("falling", "plateau")


@pytest.mark.parametrize("peak,spiked", [(5.2, True), (3.6, False)])
def test_a_warm_up_that_overshoots_by_more_than_half_is_a_spike_a_small_bump_is_not(peak, spiked):
    """A GPT-style run with AdamW at 100x its rate under a 20-step warm-up: 3.07 (ln 21) before any update, up to
    5.2 (1.7x, 0.7 of the reference) by step 8, then down to 2.5. A bump to 3.6 (1.17x) is minibatch noise
    of a healthy start."""
    r = random.Random(2)
    rise = [3.07 + (peak - 3.07) * i / 8 for i in range(9)]
    curve = rise + [peak - (peak - 2.5) * (1 - math.exp(-i / 12)) + r.gauss(0, 0.03) for i in range(51)]
    shape = classify(Curves(curve), reference=math.log(21))
    assert (shape.shape == "spiked") == spiked, shape.evidence
    assert shape.normal != spiked


def test_a_smaller_early_blow_up_that_the_run_never_got_below_is_not_yet_oscillating():
    """pytorch/examples' MNIST (Adadelta at 1.0) watched for 20 slow steps: 2.28, then 3.62 (1.6x) at the first
    update, 2.08 at the end: 9% of ln(10) below its start. Under 2x that is no conclusion about the curve."""
    r = random.Random(3)
    curve = [2.28, 3.62, 3.1, 2.9] + [2.7 - 0.04 * i + r.gauss(0, 0.05) for i in range(16)]
    assert classify(Curves(curve), reference=math.log(10)).shape != "oscillating"


def test_a_curve_that_ends_above_its_start_is_never_said_to_have_fallen():
    """A noisy loss whose last third improves but that ends above its first points (a diffusion model's healthy
    run read 0.8165 at the start and 0.8682 at the end): the sentence says it rose, as its numbers do."""
    train = [1.0] * 3 + [1.0 + 0.02 * i for i in range(20)] + [1.4 - 0.006 * i for i in range(40)]
    shape = classify(Curves(train))
    assert shape.data["end"] > shape.data["start"]
    assert "fell" not in shape.evidence and "rose from" in shape.evidence, (shape.shape, shape.evidence)
    falling = classify(Curves([1.4 - 0.005 * i for i in range(200)]))
    assert "fell from" in falling.evidence
