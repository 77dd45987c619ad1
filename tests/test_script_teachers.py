"""Script mode on a student with an averaged teacher (found on a public Mean Teacher script): the teacher's forward
runs after the student's, without a graph. The student's loss is still read as computed from its own output (it was
'not from the model', which also stopped every rerun), and a consistency target taken from the student itself with
grad on is found beside a supervised term (half the calls, all of one call site)."""

from __future__ import annotations

from tests.test_script_interventions import run, script, target_of

MEAN_TEACHER = '''
import copy, torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
X = torch.randn(1024, 20); W = torch.randn(20, 5); Y = (X @ W).argmax(1)
student = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5))
teacher = copy.deepcopy(student)
for p in teacher.parameters():
    p.requires_grad_(False)
opt = torch.optim.SGD(student.parameters(), lr=0.1, momentum=0.9)
for step in range(40):
    i = torch.randint(0, 1024, (64,))
    x, y = X[i], Y[i]
    s_out = student(x + 0.1 * torch.randn_like(x))
    {TARGET}
    loss = F.cross_entropy(s_out, y) + F.mse_loss(F.softmax(s_out, 1), F.softmax(t_out, 1))
    opt.zero_grad(); loss.backward(); opt.step()
    with torch.no_grad():
        for tp, sp in zip(teacher.parameters(), student.parameters()):
            tp.mul_(0.99).add_(sp, alpha=0.01)
'''
TEACHER = "with torch.no_grad():\n        t_out = teacher(x + 0.1 * torch.randn_like(x))"
SELF = "t_out = student(x + 0.1 * torch.randn_like(x))"


def test_the_students_loss_is_from_its_own_output_when_the_teacher_ran_last(tmp_path):
    result = run(target_of(script(tmp_path, text=MEAN_TEACHER.format(TARGET=TEACHER)), 40), "trace-loss-target")
    assert result.status == "passed", result.summary


def test_a_consistency_target_from_the_student_with_grad_is_found_beside_the_supervised_term(tmp_path):
    result = run(target_of(script(tmp_path, text=MEAN_TEACHER.format(TARGET=SELF)), 40), "trace-loss-target")
    assert result.outcome == "target-carries-grad" and "40 of 40" in result.summary, result.summary


def test_an_averaged_teacher_in_train_mode_is_the_scripts_choice_but_a_fixed_one_is_not(tmp_path):
    """Mean Teacher keeps its EMA teacher in train mode (dropout as noise): its parameters change without an
    optimizer, so it is not an evaluation left in training mode. A teacher whose parameters never change (loaded,
    fixed) run in train mode under no_grad is still read as model.eval() missing."""
    with_dropout = MEAN_TEACHER.replace("nn.ReLU(), nn.Linear(64, 5))", "nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 5))")
    averaged = run(target_of(script(tmp_path, text=with_dropout.format(TARGET=TEACHER)), 40), "trace-eval-mode")
    assert averaged.status == "passed" and "averaged" in averaged.summary, averaged.summary
    fixed = with_dropout.replace("tp.mul_(0.99).add_(sp, alpha=0.01)", "pass")
    result = run(target_of(script(tmp_path, name="fixed.py", text=fixed.format(TARGET=TEACHER)), 40), "trace-eval-mode")
    assert result.outcome == "train-mode-in-eval", result.summary
