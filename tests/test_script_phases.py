"""Script mode on scripts that train in phases (found on pytorch/tutorials' knowledge distillation): a teacher
trained by its own optimizer, then a student distilled from it. The phases are not competing objectives (the
teacher's optimizer no longer steps); a teacher run with grad mode on is gradients computed for nothing; a fault
in the second phase's loss input is read on that phase's own calls, not pooled with the first's."""

from __future__ import annotations

from nnwizard.probes._objectives import objectives
from tests.test_script_interventions import run, script, target_of

PHASES = '''
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
X = torch.randn(512, 20); Y = (X[:, :10].sum(1) > 0).long() + 2 * (X[:, 10:].sum(1) > 0).long()
teacher = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
student = nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 4))
opt_t = torch.optim.Adam(teacher.parameters(), lr=1e-2)
for step in range(30):
    i = torch.randint(0, 512, (64,))
    loss = F.cross_entropy(teacher(X[i]), Y[i])
    opt_t.zero_grad(); loss.backward(); opt_t.step()
teacher.eval()
opt_s = torch.optim.Adam(student.parameters(), lr=1e-2)
for step in range(30):
    i = torch.randint(0, 512, (64,))
    {TEACHER}
    s_logits = student(X[i])
    kd = F.kl_div(F.log_softmax(s_logits / 2, -1), F.softmax(t_logits / 2, -1), reduction="batchmean")
    loss = 0.5 * kd + 0.5 * F.cross_entropy({STUDENT}, Y[i])
    opt_s.zero_grad(); loss.backward(); opt_s.step()
'''
NO_GRAD = "with torch.no_grad():\n        t_logits = teacher(X[i])"
WITH_GRAD = "t_logits = teacher(X[i])"


def _target(tmp_path, teacher=NO_GRAD, student="s_logits"):
    return target_of(script(tmp_path, text=PHASES.format(TEACHER=teacher, STUDENT=student)), 60)


def test_a_teacher_run_with_grad_after_its_training_is_gradients_for_nothing_not_a_competing_objective(tmp_path):
    target = _target(tmp_path, WITH_GRAD)
    objs = objectives(target.recording)
    assert not objs.adversarial and objs.idle_through, objs.text
    result = run(target, "trace-eval-grad")
    assert result.outcome == "grad-into-fixed-model", result.summary


def test_a_teacher_under_no_grad_is_quiet(tmp_path):
    target = _target(tmp_path)
    assert not objectives(target.recording).idle_through
    result = run(target, "trace-eval-grad")
    assert result.outcome != "grad-into-fixed-model", result.summary


def test_a_softmax_before_the_second_phases_cross_entropy_is_read_on_that_phases_calls(tmp_path):
    """The teacher's 30 healthy calls fill the kept copies first; the student's calls are still kept and read."""
    result = run(_target(tmp_path, student="F.softmax(s_logits, -1)"), "trace-loss-input")
    assert result.outcome == "double-softmax", result.summary
    healthy = run(_target(tmp_path), "trace-loss-input")
    assert healthy.status == "passed", healthy.summary
